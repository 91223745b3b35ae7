"""The floor a host's memory puts under a one-host allreduce, measured with numpy (no nezha).

Whatever the algorithm, every rank of an allreduce of B bytes reads its B-byte input and writes its
B-byte output: at least one copy's traffic per rank, all ranks at once (the shmcoll rail moves its
workspace through the caches chunk by chunk, so the copy is what reaches DRAM). This times n
processes each copying B bytes at the same moment (np.copyto, barrier-started, median of the
slowest), and one process alone (what one thread per rank can move), so that a nezha figure on the
same host reads against what its memory allows.

    python benchmarks/host_memory_floor.py --ranks 8 --bytes 64M --iters 20 [--json FILE]
"""
import argparse
import json
import multiprocessing as mp
import time

import numpy as np


def parse_bytes(text):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    return int(text[:-1] if mult > 1 else text) * mult


def copy_rank(nbytes, iters, barrier, out):
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    times = []
    for _ in range(iters + 2):
        barrier.wait()
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    out.put(sorted(times[2:])[len(times[2:]) // 2])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--bytes", type=parse_bytes, default=64 << 20)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--json")
    args = parser.parse_args()
    ctx = mp.get_context("fork")

    def concurrent_copy_s(n):
        out, barrier = ctx.Queue(), ctx.Barrier(n)
        procs = [ctx.Process(target=copy_rank, args=(args.bytes, args.iters, barrier, out)) for _ in range(n)]
        for p in procs:
            p.start()
        slowest = max(out.get(timeout=300) for _ in procs)
        for p in procs:
            p.join()
        return slowest

    alone_s, all_s = concurrent_copy_s(1), concurrent_copy_s(args.ranks)
    record = {"ranks": args.ranks, "bytes": args.bytes, "iters": args.iters,
              "copy_alone_ms": alone_s * 1e3, "copy_alone_gbytes_per_s": args.bytes / alone_s / 1e9,
              "copy_all_ms": all_s * 1e3, "copy_all_gbytes_per_s": args.ranks * args.bytes / all_s / 1e9,
              "floor_busbw_gbps": args.bytes * 8 * 2 * (args.ranks - 1) / args.ranks / all_s / 1e9}
    print(f"{args.bytes >> 20} MB copied by one process: {record['copy_alone_ms']:.2f} ms "
          f"({record['copy_alone_gbytes_per_s']:.1f} GB/s); by {args.ranks} at once: {record['copy_all_ms']:.2f} ms "
          f"({record['copy_all_gbytes_per_s']:.1f} GB/s in all) = an allreduce floor of busbw "
          f"{record['floor_busbw_gbps']:.1f} Gbit/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
