"""A flax/optax MLP trained data-parallel with nezha.jax on locally generated data.

    nezharun -np 2 python examples/jax_flax_mlp.py --epochs 5

Each rank generates the same synthetic classification problem (three Gaussian blobs per class in
8 dimensions), trains on its own shard of it with `nezha.jax.DistributedOptimizer`, and prints the
loss and accuracy on a held-out set before and after each epoch (rank 0).
"""
import argparse

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import nezha.jax as nj


class MLP(nn.Module):
    classes: int

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(64)(x))
        x = nn.relu(nn.Dense(64)(x))
        return nn.Dense(self.classes)(x)


def make_data(samples, classes, seed):
    rng = np.random.default_rng(seed)
    centers = np.random.default_rng(0).standard_normal((classes, 3, 8)) * 2.0
    labels = rng.integers(0, classes, samples)
    x = centers[labels, rng.integers(0, 3, samples)] + rng.standard_normal((samples, 8))
    return x.astype(np.float32), labels.astype(np.int32)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--train-samples", type=int, default=4096)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--classes", type=int, default=5)
    args = parser.parse_args()

    nj.init()
    rank, size = nj.rank(), nj.size()
    x_train, y_train = make_data(args.train_samples, args.classes, seed=1)
    x_test, y_test = make_data(1024, args.classes, seed=2)
    x_train, y_train = x_train[rank::size], y_train[rank::size]  # this rank's shard

    model = MLP(args.classes)
    params = model.init(jax.random.PRNGKey(rank), jnp.zeros((1, 8)))
    params = nj.broadcast_parameters(params, root_rank=0)  # every replica starts identical
    tx = nj.DistributedOptimizer(optax.adam(args.lr * size))
    opt_state = tx.init(params)

    def loss_fn(params, x, y):
        logits = model.apply(params, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), logits

    @jax.jit
    def train_step(params, opt_state, x, y):
        (loss, _), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, nj.allreduce(loss)

    @jax.jit
    def evaluate(params):
        loss, logits = loss_fn(params, x_test, y_test)
        return loss, jnp.mean(jnp.argmax(logits, -1) == y_test)

    def show(what):
        loss, acc = evaluate(params)
        if rank == 0:
            print(f"{what}test loss {float(loss):.4f}, accuracy {100 * float(acc):.1f}%", flush=True)

    show("before training: ")
    steps = len(x_train) // args.batch_size
    for epoch in range(args.epochs):
        order = np.random.default_rng(epoch).permutation(len(x_train))
        for s in range(steps):
            idx = order[s * args.batch_size:(s + 1) * args.batch_size]
            params, opt_state, train_loss = train_step(params, opt_state, x_train[idx], y_train[idx])
        show(f"epoch {epoch + 1}: train loss {float(train_loss):.4f}, ")
    nj.shutdown()


if __name__ == "__main__":
    main()
