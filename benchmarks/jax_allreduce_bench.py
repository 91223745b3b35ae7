#!/usr/bin/env python3
"""nezha.jax allreduce inside jax.jit against the numpy API and JAX's own gloo psum (issue 20).

    nezharun -np 4 python benchmarks/jax_allreduce_bench.py --sizes 8,1K,64K,1M,16M,64M \
        --leaves 8 --baseline gloo --json out.json

Per size (bytes per rank, float32): `numpy` = nezha.grouped_allreduce on numpy arrays;
`nezha-jit` = a jitted nezha.jax.grouped_allreduce of a pytree of `--leaves` arrays (one grouped
custom call); `gloo-jit` = jax.distributed with gloo CPU collectives, a jitted shard_map psum
pointed at the first rail's interface (JAX has no public setting for it: the CPU backend factory
is replaced, as the issue says). Median over iterations (up to 64 KB taken in turns, see
timed_interleaved), max over ranks; busbw as nccl-tests.

`--in-jit-loop K` (sizes up to 64 KB) adds `nezha-loop` and `gloo-loop`: one jitted call runs K
allreduces one after the other (a `lax.fori_loop`, each taking the previous result times 1/size),
timed per allreduce. That is the collective's latency inside a jitted program, without JAX's
dispatch of a jitted call from Python (which both pay alike once per call).

`--tree-leaves M` adds `jit-tree`: the same bytes as a jitted pytree of M leaves, beside `--leaves`
(e.g. one 64 MB array against 8 x 8 MB, issue 39 point 4). `--large-rounds R` makes sizes above
64 KB take turns in R blocks as well (default 1: each implementation's iterations in one block).
"""
import argparse
import json
import os
import time

import numpy as np

import nezha
from nezha.bench.gloo_baseline import decode_endpoint, encode_endpoint, interface_of, pick_free_port
from nezha.bench.sizes import parse_sizes


def start_gloo(rank, size):
    """jax.distributed + gloo on rank 0's first-rail address; gloo bound to this rank's first rail."""
    import jax
    from jax._src import distributed, xla_bridge
    from jaxlib import _jax

    addr = nezha.rail_stats()[0]["local_addr"]
    endpoint = encode_endpoint(addr, pick_free_port(addr)) if rank == 0 else np.zeros(128, np.uint8)
    coord_addr, coord_port = decode_endpoint(nezha.broadcast(endpoint, 0, name="jaxbench.coord"))
    ifname = interface_of(addr)

    original = xla_bridge.make_cpu_client

    def cpu_client_on_rail(collectives=None):
        collectives = _jax.make_gloo_tcp_collectives(
            distributed_client=distributed.global_state.client, interface=ifname)
        return original(collectives=collectives)

    xla_bridge.register_backend_factory("cpu", cpu_client_on_rail, priority=0, fail_quietly=False)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"{coord_addr}:{coord_port}", num_processes=size, process_id=rank)
    return ifname


def timed_interleaved(fns, iters, warmup, rounds):
    """Median us per operation of each fn, given as (fn, operations per call). The calls run in
    `rounds` blocks taking turns (A B C A B C ...), so a drift of the machine's state over the run
    (thread placement on 2 shared cores moves the small-message figures by +-30 % from run to run)
    weighs on every implementation alike; each block runs about `iters / rounds` operations."""
    for fn, _ in fns.values():
        for _ in range(warmup):
            fn()
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for k, (fn, ops_per_call) in fns.items():
            for _ in range(max(1, iters // rounds // ops_per_call)):
                t0 = time.perf_counter()
                fn()
                times[k].append((time.perf_counter() - t0) / ops_per_call)
    return {k: float(np.median(v)) * 1e6 for k, v in times.items()}


def check_close(name, got, want):
    if not np.allclose(np.asarray(got), want, rtol=1e-6):
        raise SystemExit(f"wrong {name} result: {np.asarray(got).ravel()[:4]}, expected {want}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,1K,64K,1M,16M,64M")
    parser.add_argument("--leaves", type=int, default=8, help="arrays in the pytree")
    parser.add_argument("--iters", type=int, default=0, help="0: by size (more for small)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5,
                        help="sizes up to 64 KB: the implementations take turns in this many blocks")
    parser.add_argument("--tree-leaves", type=int, default=0, metavar="M",
                        help="also time the same bytes as a jitted pytree of M leaves (jit-tree)")
    parser.add_argument("--large-rounds", type=int, default=1,
                        help="sizes above 64 KB: the implementations take turns in this many blocks")
    parser.add_argument("--in-jit-loop", type=int, default=0, metavar="K",
                        help="also time K allreduces in one jitted call (sizes up to 64 KB)")
    parser.add_argument("--baseline", choices=["none", "gloo"], default="none")
    parser.add_argument("--json")
    args = parser.parse_args()

    nezha.init()
    rank, size = nezha.rank(), nezha.size()
    ifname = start_gloo(rank, size) if args.baseline == "gloo" else None
    import jax
    import jax.numpy as jnp
    import nezha.jax as nj
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    records = []
    for nbytes in parse_sizes(args.sizes):
        count = max(1, nbytes // 4)
        leaves = min(args.leaves, count)
        parts = [count // leaves + (1 if i < count % leaves else 0) for i in range(leaves)]
        host = [np.full(p, rank + 1, np.float32) for p in parts]
        dev = {f"w{i}": jnp.asarray(h) for i, h in enumerate(host)}
        iters = args.iters or (400 if nbytes <= 65536 else 30 if nbytes <= 1 << 20 else 5)
        step = jax.jit(lambda t: nj.grouped_allreduce(t, op=nj.Sum))
        for v in step(dev).values():
            check_close(f"nezha-jit {nbytes} B", v, size * (size + 1) / 2)
        fns = {"numpy": (lambda: nezha.grouped_allreduce(host, op=nezha.Sum), 1),
               "nezha-jit": (lambda: jax.block_until_ready(step(dev)), 1)}
        tree_leaves = min(args.tree_leaves, count)
        if tree_leaves:
            tparts = [count // tree_leaves + (1 if i < count % tree_leaves else 0)
                      for i in range(tree_leaves)]
            tree = {f"t{i}": jnp.full(p, rank + 1, jnp.float32) for i, p in enumerate(tparts)}
            for v in step(tree).values():  # the same jitted function, traced for this structure
                check_close(f"jit-tree {nbytes} B", v, size * (size + 1) / 2)
            fns["jit-tree"] = (lambda: jax.block_until_ready(step(tree)), 1)
        loop = args.in_jit_loop if nbytes <= 65536 else 0
        if loop:  # x -> sum over ranks / size: every rank holds the mean (size + 1) / 2 throughout
            body = lambda i, t: jax.tree.map(lambda v: v * (1.0 / size),
                                             nj.grouped_allreduce(t, op=nj.Sum))
            looped = jax.jit(lambda t: jax.lax.fori_loop(0, loop, body, t))
            for v in looped(dev).values():
                check_close(f"nezha-loop {nbytes} B", v, (size + 1) / 2)
            fns["nezha-loop"] = (lambda: jax.block_until_ready(looped(dev)), loop)
        if ifname:
            mesh = Mesh(np.array(jax.devices()), ("i",))
            garr = jax.make_array_from_process_local_data(
                NamedSharding(mesh, P("i")), np.concatenate(host)[None])
            psum = jax.jit(jax.shard_map(lambda x: jax.lax.psum(x, "i"), mesh=mesh,
                                         in_specs=P("i"), out_specs=P()))
            fns["gloo-jit"] = (lambda: jax.block_until_ready(psum(garr)), 1)
            if loop:  # check_vma off: psum's result is not varying over "i", the loop's carry is
                gbody = lambda i, x: jax.lax.psum(x, "i") * (1.0 / size)
                glooped = jax.jit(jax.shard_map(lambda x: jax.lax.fori_loop(0, loop, gbody, x),
                                                mesh=mesh, in_specs=P("i"), out_specs=P("i"),
                                                check_vma=False))
                check_close(f"gloo-loop {nbytes} B", glooped(garr).addressable_data(0),
                            (size + 1) / 2)
                fns["gloo-loop"] = (lambda: jax.block_until_ready(glooped(garr)), loop)
        rounds = args.rounds if nbytes <= 65536 else args.large_rounds
        results = timed_interleaved(fns, iters, args.warmup, rounds)
        for impl, us in results.items():
            worst = float(np.max(nezha.allgather(np.array([us]), name=f"jaxbench.{impl}.{nbytes}")))
            busbw = 4 * count * 8 * 2 * (size - 1) / size / (worst * 1e3)  # nccl-tests
            records.append({"op": "allreduce", "bytes": 4 * count,
                            "leaves": tree_leaves if impl == "jit-tree" else leaves, "ranks": size,
                            "impl": impl, "time_us": worst, "busbw_gbps": busbw})
            if rank == 0:
                print(f"{4 * count:>10} B {impl:>10}: {worst:10.1f} us  busbw {busbw:.3f} Gbit/s",
                      flush=True)
    if args.json and rank == 0:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)
    nezha.shutdown()


if __name__ == "__main__":
    main()
