#!/usr/bin/env python3
"""One data-parallel training step inside jax.jit: nezha.jax.DistributedOptimizer against a
jax.distributed + gloo step (shard_map, lax.pmean of the gradients, gloo on rail 0), same model,
data and optimizer (issue 20).

    nezharun -np 4 python benchmarks/jax_train_bench.py --width 1024 --depth 4 --batch-size 16
"""
import argparse
import time

import numpy as np

import nezha
from jax_allreduce_bench import start_gloo


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=16, help="per rank")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()

    nezha.init()
    rank, size = nezha.rank(), nezha.size()
    start_gloo(rank, size)
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import optax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    import nezha.jax as nj

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            for _ in range(args.depth):
                x = nn.relu(nn.Dense(args.width)(x))
            return nn.Dense(1000)(x)

    model = MLP()
    rng = np.random.default_rng(rank)
    x = rng.standard_normal((args.batch_size, 3072)).astype(np.float32)
    y = rng.integers(0, 1000, args.batch_size).astype(np.int32)
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 3072)))
    n_params = sum(int(np.prod(p.shape)) for p in jax.tree_util.tree_leaves(params))

    def loss_fn(p, x, y):
        return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean()

    tx = nj.DistributedOptimizer(optax.sgd(0.01))

    @jax.jit
    def nezha_step(p, s, x, y):
        updates, s = tx.update(jax.grad(loss_fn)(p, x, y), s, p)
        return optax.apply_updates(p, updates), s

    mesh = Mesh(np.array(jax.devices()), ("i",))
    plain = optax.sgd(0.01)

    def gloo_body(p, s, x, y):
        grads = jax.lax.pmean(jax.grad(loss_fn)(p, x[0], y[0]), "i")
        updates, s = plain.update(grads, s, p)
        return optax.apply_updates(p, updates), s

    gloo_step = jax.jit(jax.shard_map(gloo_body, mesh=mesh, in_specs=(P(), P(), P("i"), P("i")),
                                      out_specs=(P(), P())))
    rep = NamedSharding(mesh, P())
    g_params = jax.tree_util.tree_map(lambda a: jax.make_array_from_process_local_data(rep, np.asarray(a)),
                                      params)
    g_state = jax.tree_util.tree_map(lambda a: jax.make_array_from_process_local_data(rep, np.asarray(a)),
                                     plain.init(params))
    shard = NamedSharding(mesh, P("i"))
    gx = jax.make_array_from_process_local_data(shard, x[None])
    gy = jax.make_array_from_process_local_data(shard, y[None])

    def timed(step, p, s, x, y):
        times = []
        for i in range(args.warmup + args.steps):
            t0 = time.perf_counter()
            p, s = step(p, s, x, y)
            jax.block_until_ready(p)
            if i >= args.warmup:
                times.append(time.perf_counter() - t0)
        return float(np.median(times)) * 1e3

    results = {"nezha-jit": timed(nezha_step, params, tx.init(params), jnp.asarray(x), jnp.asarray(y)),
               "gloo-jit": timed(gloo_step, g_params, g_state, gx, gy)}
    for impl, ms in results.items():
        worst = float(np.max(nezha.allgather(np.array([ms]), name=f"jaxtrain.{impl}")))
        if rank == 0:
            print(f"{impl:>10}: {worst:8.1f} ms/step ({n_params / 1e6:.1f}M parameters, "
                  f"batch {args.batch_size} per rank, {size} ranks)", flush=True)
    nezha.shutdown()


if __name__ == "__main__":
    main()
