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
    """Median us per call of each fn. The calls run in `rounds` blocks taking turns (A B C A B C ...),
    so a drift of the machine's state over the run (thread placement on 2 shared cores moves the
    small-message figures by +-30 % from run to run) weighs on every implementation alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {k: [] for k in fns}
    per_round = max(1, iters // rounds)
    for _ in range(rounds):
        for k, fn in fns.items():
            for _ in range(per_round):
                t0 = time.perf_counter()
                fn()
                times[k].append(time.perf_counter() - t0)
    return {k: float(np.median(v)) * 1e6 for k, v in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,1K,64K,1M,16M,64M")
    parser.add_argument("--leaves", type=int, default=8, help="arrays in the pytree")
    parser.add_argument("--iters", type=int, default=0, help="0: by size (more for small)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5,
                        help="sizes up to 64 KB: the implementations take turns in this many blocks")
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
        out = step(dev)
        expected = size * (size + 1) / 2
        if not all(np.all(np.asarray(v) == expected) for v in out.values()):
            raise SystemExit(f"wrong nezha-jit result at {nbytes} B")
        fns = {"numpy": lambda: nezha.grouped_allreduce(host, op=nezha.Sum),
               "nezha-jit": lambda: jax.block_until_ready(step(dev))}
        if ifname:
            mesh = Mesh(np.array(jax.devices()), ("i",))
            garr = jax.make_array_from_process_local_data(
                NamedSharding(mesh, P("i")), np.concatenate(host)[None])
            psum = jax.jit(jax.shard_map(lambda x: jax.lax.psum(x, "i"), mesh=mesh,
                                         in_specs=P("i"), out_specs=P()))
            fns["gloo-jit"] = lambda: jax.block_until_ready(psum(garr))
        results = timed_interleaved(fns, iters, args.warmup, args.rounds if nbytes <= 65536 else 1)
        for impl, us in results.items():
            worst = float(np.max(nezha.allgather(np.array([us]), name=f"jaxbench.{impl}.{nbytes}")))
            busbw = 4 * count * 8 * 2 * (size - 1) / size / (worst * 1e3)  # nccl-tests
            records.append({"op": "allreduce", "bytes": 4 * count, "leaves": leaves, "ranks": size,
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
