#!/usr/bin/env python3
"""One run of the growth benchmark (issue 42): what init, memory and small-to-large collectives cost
at one job size, for nezha or for torch.distributed on Gloo. Run under nezharun:

    nezharun -np 8 python benchmarks/scale_worker.py --impl nezha --sizes 8,64K,4M --iters 20 \\
        --ops allreduce,broadcast --json out.json

Every rank times its own init (perf_counter around nezha.init / init_process_group("gloo") over
env://); the job reports the slowest rank's, and the time from the last rank's call to the last
return (init itself, without the ranks' start-up skew). Per op and size: 3 warmup calls, then
--iters timed calls of one float32 array (same name every call); each rank takes its median, the
job reports the slowest rank's median. The last result of every series is checked against numpy on
every rank; a mismatch fails the job. Memory (RSS, fds, nezha's shm) is read right after init.
Rank 0 writes one JSON object; benchmarks/scale_one_host.py runs this across job sizes.
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import psutil

# Not an extra cost for the Gloo runs: nezharun's sitecustomize already imports the nezha package
# (through nezha.runner.torch_store) in every rank that imports torch.distributed.
from nezha.bench.sizes import parse_sizes

WARMUP = 3
OPS = ("allreduce", "broadcast")
SHM_MEMFD = "/memfd:nezha-shm"  # nezha's shm segments are sealed memfds, never named in /dev/shm


class NezhaComm:
    def __init__(self):  # imports here, outside the timed init()
        import nezha
        self.nz = nezha

    def reach_store(self):
        return 0.0  # nezharun's rendezvous store is up before any rank starts

    def init(self):
        self.nz.init()
        self.rank, self.size = self.nz.rank(), self.nz.size()

    def reduce_max(self, values):
        values = np.asarray(values, dtype=np.float64)
        return self.nz.allreduce(values, op=self.nz.Max, name="scale.max")

    def gather(self, row, name):
        return self.nz.allgather(np.asarray([row], dtype=np.float64), name=name)

    def barrier(self):
        self.nz.barrier()

    def series(self, op, count):
        """(output, reset, one call): the input is never written, so nothing needs resetting."""
        src = np.full(count, self.rank + 1, dtype=np.float32)
        out = np.empty_like(src)
        name = f"scale.{op}.{count}"
        if op == "allreduce":
            return out, None, lambda: self.nz.allreduce(src, op=self.nz.Sum, name=name, out=out)
        return out, None, lambda: self.nz.broadcast(src, root_rank=0, name=name, out=out)

    def shutdown(self):
        self.nz.shutdown()


class GlooComm:
    def __init__(self):  # imports here, outside the timed init()
        import torch
        import torch.distributed as dist
        self.torch, self.dist = torch, dist
        torch.set_num_threads(1)

    def reach_store(self):
        """Seconds until the store nezharun serves for env:// answers. nezharun starts it (and
        imports torch) only when the first rank connects: a launcher cost, not Gloo's, so it is
        paid here, before init is timed, and reported apart."""
        started = time.perf_counter()
        self.dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                           is_master=False, wait_for_workers=False)
        return time.perf_counter() - started

    def init(self):
        self.dist.init_process_group("gloo")  # env://: the store nezharun serves (torch_store.py)
        self.rank, self.size = self.dist.get_rank(), self.dist.get_world_size()

    def reduce_max(self, values):
        tensor = self.torch.tensor(values, dtype=self.torch.float64)
        self.dist.all_reduce(tensor, op=self.dist.ReduceOp.MAX)
        return tensor.numpy()

    def gather(self, row, name):
        mine = self.torch.tensor([row], dtype=self.torch.float64)
        rows = [self.torch.empty_like(mine) for _ in range(self.dist.get_world_size())]
        self.dist.all_gather(rows, mine)
        return self.torch.cat(rows).numpy()

    def barrier(self):
        self.dist.barrier()

    def series(self, op, count):
        """Gloo works in place: the input is restored before each call (outside the timed part)."""
        src = self.torch.full((count,), float(self.rank + 1), dtype=self.torch.float32)
        buf = src.clone()
        if op == "allreduce":
            call = lambda: self.dist.all_reduce(buf)  # noqa: E731
        else:
            call = lambda: self.dist.broadcast(buf, src=0)  # noqa: E731
        return buf.numpy(), (lambda: buf.copy_(src)), call

    def shutdown(self):
        self.dist.destroy_process_group()


def expected(op, n):
    """Every element after one call: the sum of rank+1 over ranks, or root 0's value."""
    return n * (n + 1) / 2 if op == "allreduce" else 1.0


def memory_row():
    """This rank's RSS (MB), open fds (sockets and memfds included) and nezha shm mappings."""
    fds = len(os.listdir("/proc/self/fd"))
    segments, mapped = set(), 0
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and fields[5] == SHM_MEMFD:
                start, end = (int(x, 16) for x in fields[0].split("-"))
                segments.add(fields[4])  # inode: one per segment, however often it is mapped
                mapped += end - start
    rss_mb = psutil.Process().memory_info().rss / 2**20
    return [rss_mb, fds, len(segments), mapped / 2**20]


def dev_shm_entries():
    """Named shm in /dev/shm (nezha names none, nor does Gloo on CPU): the check that it stays 0.
    No name ties an entry to one job, so every nezha entry counts."""
    return sum("nezha" in entry for entry in os.listdir("/dev/shm"))


def time_series(comm, op, count, iters):
    """Median seconds of `iters` calls after WARMUP, this process's CPU seconds per timed call (all
    its threads: the library's own included), and whether the last result was right."""
    out, reset, call = comm.series(op, count)
    samples = []
    comm.barrier()
    cpu = 0.0
    for i in range(WARMUP + iters):
        if reset:
            reset()
        cpu_before, started = time.process_time(), time.perf_counter()
        call()
        if i >= WARMUP:
            samples.append(time.perf_counter() - started)
            cpu += time.process_time() - cpu_before
    return statistics.median(samples), cpu / iters, bool(np.all(out == expected(op, comm.size)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", choices=("nezha", "gloo"), required=True)
    parser.add_argument("--sizes", default="8,64K,4M", help="message sizes in bytes (float32)")
    parser.add_argument("--iters", type=int, default=20, help="timed calls per op and size")
    parser.add_argument("--ops", default=",".join(OPS), help="comma list of " + ", ".join(OPS))
    parser.add_argument("--json", help="rank 0 writes the record here")
    args = parser.parse_args()
    sizes = parse_sizes(args.sizes)
    ops = [op for op in args.ops.split(",") if op]
    unknown = sorted(set(ops) - set(OPS))
    if unknown or not ops:
        parser.error(f"--ops: unknown {unknown}; choose from {', '.join(OPS)}")
    if any(size % 4 for size in sizes):
        parser.error("--sizes: every size must be a multiple of 4 bytes (float32)")

    comm = NezhaComm() if args.impl == "nezha" else GlooComm()
    store_s = comm.reach_store()
    rss_before_mb = psutil.Process().memory_info().rss / 2**20
    started, wall_start = time.perf_counter(), time.time()
    comm.init()
    init_s, wall_end = time.perf_counter() - started, time.time()
    rank, n = comm.rank, comm.size
    # One row per rank; RSS growth across init is the library's own cost, apart from its imports
    # (torch for Gloo).
    row = memory_row()
    memory = comm.gather(row + [row[0] - rss_before_mb], "scale.memory")
    shm_entries = dev_shm_entries() if rank == 0 else 0

    cases = [(op, size) for op in ops for size in sizes]
    medians, cpus, wrong = [], [], []
    for op, size in cases:
        median, cpu, ok = time_series(comm, op, size // 4, args.iters)
        medians.append(median)
        cpus.append(cpu)
        wrong.append(0.0 if ok else 1.0)
    cpu_by_rank = comm.gather(cpus, "scale.cpu")  # rank 0 negotiates for all: its CPU apart
    # One reduction for everything, so a wrong result on any rank stops every rank together.
    # init waits for the last rank to arrive, so the slowest init includes the ranks' start-up skew
    # (the interpreter and imports of n processes on this host's cores); what init itself costs is
    # the time from the last rank's call to the last return (one host: one clock).
    head = [init_s, wall_start, wall_end, -wall_start, store_s]
    slowest = comm.reduce_max(head + medians + wrong)
    medians_max = slowest[len(head):len(head) + len(cases)]
    failed = [case for case, bad in zip(cases, slowest[len(head) + len(cases):]) if bad]
    if failed and rank == 0:
        print(f"scale_worker: WRONG RESULT ({args.impl}, {n} ranks) for "
              + ", ".join(f"{op} of {size} B" for op, size in failed), file=sys.stderr, flush=True)
    comm.barrier()  # rank 0 has said why before any rank exits (nezharun then stops the rest)
    comm.shutdown()
    if failed:
        sys.exit(1)
    if rank != 0:
        return
    record = {"impl": args.impl, "ranks": n, "init_s": float(slowest[0]),
              "init_after_last_s": float(slowest[2] - slowest[1]),
              "start_skew_s": float(slowest[1] + slowest[3]), "store_wait_s": float(slowest[4]),
              "rss_mb_max": float(memory[:, 0].max()), "rss_mb_mean": float(memory[:, 0].mean()),
              "rss_init_mb_max": float(memory[:, 4].max()),
              "fds_max": int(memory[:, 1].max()), "fds_mean": float(memory[:, 1].mean()),
              "shm_entries": shm_entries, "shm_segments_max": int(memory[:, 2].max()),
              "shm_mapped_mb_max": float(memory[:, 3].max()),
              "ops": [{"op": op, "bytes": size, "time_us": float(t) * 1e6,
                       "cpu_us_rank0": float(cpu_by_rank[0, k]) * 1e6,
                       "cpu_us_others_mean": float(cpu_by_rank[1:, k].mean()) * 1e6 if n > 1 else 0.0}
                      for k, ((op, size), t) in enumerate(zip(cases, medians_max))]}
    print(json.dumps(record), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
