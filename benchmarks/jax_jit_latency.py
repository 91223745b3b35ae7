#!/usr/bin/env python3
"""Where a tiny jitted nezha.jax allreduce spends its time (issue 20), on whatever backend jax has:
median of 300 calls of a jitted `t + 1` (jax's own dispatch), a jitted 8 B allreduce (one leaf),
an 8-leaf pytree of 8 B leaves, the numpy API, and a device -> host -> device round trip through
numpy (what the io_callback pays). One process, or under nezharun.

    python benchmarks/jax_jit_latency.py                       # size 1: no peer, the handler alone
    nezharun -np 2 python benchmarks/jax_jit_latency.py
    NEZHA_JAX_FORCE_CALLBACK=1 python benchmarks/jax_jit_latency.py   # the io_callback path
"""
import time

import numpy as np

import jax
import jax.numpy as jnp

import nezha
import nezha.jax as nj

nj.init()


def med(f, n=300):
    for _ in range(20):
        f()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
    return np.median(ts) * 1e6


x = jnp.ones(2, jnp.float32); h = np.ones(2, np.float32)
ident = jax.jit(lambda t: t + 1)
ar = jax.jit(lambda t: nj.allreduce(t + 1, op=nj.Sum))
ar8 = jax.jit(lambda ts: nj.grouped_allreduce(ts, op=nj.Sum))
xs = [jnp.ones(2, jnp.float32) for _ in range(8)]
r = {"jit identity": med(lambda: jax.block_until_ready(ident(x))),
     "jit allreduce (FFI)": med(lambda: jax.block_until_ready(ar(x))),
     "jit 8-leaf grouped (FFI)": med(lambda: jax.block_until_ready(ar8(xs))),
     "numpy allreduce": med(lambda: nezha.allreduce(h, op=nezha.Sum)),
     "device->host->device only": med(lambda: jax.block_until_ready(jnp.asarray(np.asarray(ident(x)))))}
if nj.rank() == 0:
    print(f"size {nj.size()}:", "; ".join(f"{k} {v:.0f} us" for k, v in r.items()), flush=True)
nj.shutdown()
