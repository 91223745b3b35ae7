"""Synthetic training throughput with nezha.jax (the flags of Horovod's synthetic benchmarks).

    nezharun -np 4 python examples/jax_synthetic_benchmark.py --model mlp46m --batch-size 16

A flax MLP on random "images" (3x64x64 by default), trained with optax SGD wrapped in
nezha.jax.DistributedOptimizer inside one jitted step. `mlp46m` (46M parameters: communication
heavy) and `mlp` (tiny, for smoke tests). Reports images/sec per rank and in total; `--json`
writes the figures and the per-step losses.
"""
import argparse
import json
import timeit

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import nezha.jax as nj

MODELS = {"mlp46m": (2048, 8), "mlp": (64, 2)}  # width, depth


class MLP(nn.Module):
    width: int
    depth: int
    classes: int = 1000

    @nn.compact
    def __call__(self, x):
        x = x.reshape((x.shape[0], -1))
        for _ in range(self.depth):
            x = nn.relu(nn.Dense(self.width)(x))
        return nn.Dense(self.classes)(x)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp46m", choices=sorted(MODELS))
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--num-warmup-batches", type=int, default=10)
    parser.add_argument("--num-batches-per-iter", type=int, default=10)
    parser.add_argument("--num-iters", type=int, default=10)
    parser.add_argument("--fp16-allreduce", action="store_true", help="fp16 on the wire")
    parser.add_argument("--json", help="write the figures and losses to this file (rank 0)")
    args = parser.parse_args()

    nj.init()
    rank, size = nj.rank(), nj.size()
    width, depth = MODELS[args.model]
    model = MLP(width, depth)
    rng = np.random.default_rng(rank)
    data = jnp.asarray(rng.standard_normal((args.batch_size, 3, args.image_size, args.image_size)),
                       jnp.float32)
    target = jnp.asarray(rng.integers(0, 1000, args.batch_size), jnp.int32)
    params = nj.broadcast_parameters(model.init(jax.random.PRNGKey(0), data[:1]))
    compression = nj.Compression.fp16 if args.fp16_allreduce else nj.Compression.none
    tx = nj.DistributedOptimizer(optax.sgd(0.01), compression=compression)
    opt_state = tx.init(params)
    n_params = sum(int(np.prod(p.shape)) for p in jax.tree_util.tree_leaves(params))

    @jax.jit
    def step(params, opt_state):
        def loss_fn(p):
            logits = model.apply(p, data)
            return optax.softmax_cross_entropy_with_integer_labels(logits, target).mean()
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    losses = []

    def run(batches):
        nonlocal params, opt_state
        for _ in range(batches):
            params, opt_state, loss = step(params, opt_state)
            losses.append(float(loss))  # also waits for the step

    def log(msg):
        if rank == 0:
            print(msg, flush=True)

    log(f"Model: {args.model} ({n_params / 1e6:.1f}M parameters), batch size {args.batch_size}, "
        f"ranks {size}, FFI path: {nj.ffi_available()}")
    run(args.num_warmup_batches)
    rates = []
    for i in range(args.num_iters):
        t = timeit.timeit(lambda: run(args.num_batches_per_iter), number=1)
        rates.append(args.batch_size * args.num_batches_per_iter / t)
        log(f"Iter #{i}: {rates[-1]:.1f} img/sec per rank")
    mean, conf = float(np.mean(rates)), float(1.96 * np.std(rates))
    log(f"Img/sec per rank: {mean:.1f} +-{conf:.1f}")
    log(f"Total img/sec on {size} rank(s): {size * mean:.1f} +-{size * conf:.1f}")
    if args.json and rank == 0:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "ranks": size, "img_sec_per_rank": mean,
                       "img_sec_total": size * mean, "losses": losses}, f)
    nj.shutdown()


if __name__ == "__main__":
    main()
