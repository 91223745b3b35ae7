"""One rank of benchmarks/grouped_compare.py: times a grouped allgather, a grouped reducescatter and a
burst of broadcasts (broadcast_parameters' pattern) of `--tensors` float32 tensors of `--bytes` each,
checks one result of each against numpy, and with `--gloo IF` times the same with torch.distributed
over Gloo (one call per tensor, all started before any is waited for). A call is timed from a
barrier to a barrier after it (so until every rank has its result; the barrier's own ~0.3 ms is in
every figure). Rank 0 writes the median seconds per call to `--json`."""
import argparse
import json
import statistics
import time

import numpy as np

import nezha


def nezha_steps(xs, outs, rank, size):
    def allgather():
        return nezha.grouped_allgather(xs, name="g")

    def reducescatter():
        return nezha.grouped_reducescatter(xs, op=nezha.Sum, name="r")

    def broadcast():
        hs = [nezha.broadcast_async(x, 0, name=f"b.{i}", out=o) for i, (x, o) in enumerate(zip(xs, outs))]
        return [h.wait() for h in hs]

    def check():
        k = len(xs)
        got = allgather()
        assert all(np.array_equal(g, np.concatenate([x * 0 + r for r in range(size)])) for g, x in zip(got, xs))
        got = reducescatter()
        n = xs[0].shape[0] // size
        assert all(np.array_equal(g, np.full(n, sum(range(size)), np.float32)) for g in got), "reducescatter"
        got = broadcast()
        assert all(np.array_equal(g, np.zeros_like(g)) for g in got) and len(got) == k, "broadcast"
    return {"allgather": allgather, "reducescatter": reducescatter, "broadcast": broadcast}, check


def gloo_steps(xs, rank, size, ifname):
    import torch
    import torch.distributed as dist
    from nezha.bench.gloo_baseline import GlooBaseline
    GlooBaseline(nezha, "gloo", ifname, 120)  # bootstraps torch.distributed over `ifname`
    ts = [torch.from_numpy(x) for x in xs]
    gathered = [torch.empty(x.shape[0] * size, dtype=torch.float32) for x in xs]
    scattered = [torch.empty(x.shape[0] // size, dtype=torch.float32) for x in xs]
    work = [t.clone() for t in ts]
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    def all_of(start):
        for w in [start(i) for i in range(len(ts))]:
            w.wait()
    return {
        "allgather": lambda: all_of(lambda i: gather(gathered[i], ts[i], async_op=True)),
        "reducescatter": lambda: all_of(lambda i: scatter(scattered[i], ts[i], op=dist.ReduceOp.SUM, async_op=True)),
        "broadcast": lambda: all_of(lambda i: dist.broadcast(work[i], src=0, async_op=True)),
    }


def timed(step, iters):
    for _ in range(2):
        step()
    out = []
    for _ in range(iters):
        nezha.barrier()
        t0 = time.perf_counter()
        step()
        # Until every rank has its result: a broadcast's root is done once its sends are buffered.
        nezha.barrier()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tensors", type=int, default=64)
    p.add_argument("--bytes", type=int, default=32 << 10, help="per tensor and rank")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--label", default="nezha")
    p.add_argument("--gloo", metavar="IF", help="also time Gloo over this interface")
    p.add_argument("--json", required=True)
    args = p.parse_args()
    nezha.init()
    rank, size = nezha.rank(), nezha.size()
    count = args.bytes // 4 // size * size
    xs = [np.full(count, rank, np.float32) for _ in range(args.tensors)]
    outs = [np.empty_like(x) for x in xs]
    steps, check = nezha_steps(xs, outs, rank, size)
    check()
    rec = {"tensors": args.tensors, "bytes": count * 4, "ranks": size,
           "seconds": {args.label: {op: timed(s, args.iters) for op, s in steps.items()}}}
    if args.gloo:
        rec["seconds"]["gloo"] = {op: timed(s, args.iters) for op, s in gloo_steps(xs, rank, size, args.gloo).items()}
    if rank == 0:
        with open(args.json, "w") as f:
            json.dump(rec, f)
    nezha.shutdown()


if __name__ == "__main__":
    main()
