"""nezha.jax.pmap and the optax/flax pieces against single-process references, on every rank."""
import hashlib

import numpy as np

from common import assert_close, fail, report

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

import nezha.jax as nj  # noqa: E402

nj.init()
r, n = nj.rank(), nj.size()

# --- pmap: collectives by axis name over local shards and processes -------------------------------
for local in (1, 2):
    shards = np.arange(n * local * 3, dtype=np.float32).reshape(n * local, 3) ** 1.5
    mine = jnp.asarray(shards[r * local:(r + 1) * local])

    def step(x):
        return {"sum": nj.psum(x, "i"), "mean": nj.pmean(x, "i"), "max": nj.pmax(x, "i"),
                "min": nj.pmin(x, "i"), "gather": nj.all_gather(x, "i"), "index": nj.axis_index("i")}

    out = nj.pmap(step, axis_name="i")(mine)
    for k in range(local):
        assert_close(out["sum"][k], shards.sum(0), f"pmap psum local={local}", rtol=1e-5)
        assert_close(out["mean"][k], shards.mean(0), f"pmap pmean local={local}", rtol=1e-5)
        assert_close(out["max"][k], shards.max(0), f"pmap pmax local={local}")
        assert_close(out["min"][k], shards.min(0), f"pmap pmin local={local}")
        assert_close(out["gather"][k], shards, f"pmap all_gather local={local}")
        assert_close(out["index"][k], np.int32(r * local + k), f"pmap axis_index local={local}")
try:
    nj.psum(jnp.ones(2), "nope")
    fail("psum with an unbound axis name did not raise")
except NameError as error:
    if "unbound axis name 'nope'" not in str(error):
        fail(f"unclear error: {error}")
report("pmap")


# --- DistributedOptimizer: equals one process training on the concatenated batches --------------
class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(1)(nn.tanh(nn.Dense(16)(x)))


model = MLP()
true_w = np.random.default_rng(0).standard_normal((4, 1))


def batch(step, k, size=8):
    rng = np.random.default_rng(1000 * step + k)
    x = rng.standard_normal((size, 4)).astype(np.float32)
    return x, (x @ true_w + 0.1 * rng.standard_normal((size, 1))).astype(np.float32)


def loss_fn(params, x, y):
    return jnp.mean((model.apply(params, x) - y) ** 2)


# Each rank starts from different parameters; broadcast_parameters makes them rank 0's.
params = nj.broadcast_parameters(model.init(jax.random.PRNGKey(r), jnp.zeros((1, 4))))
ref_params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 4)))


def digest(tree):
    h = hashlib.sha256()
    for leaf in jax.tree_util.tree_leaves(tree):
        h.update(np.asarray(leaf).tobytes())
    return h.hexdigest()


def train(tx, passes, params, ref_params, steps=6):
    dist_tx = nj.DistributedOptimizer(tx, backward_passes_per_step=passes)
    state, ref_state = dist_tx.init(params), optax.MultiSteps(tx, passes).init(ref_params)
    ref_tx = optax.MultiSteps(tx, passes)

    @jax.jit
    def step(params, state, x, y):
        grads = jax.grad(loss_fn)(params, x, y)
        updates, state = dist_tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    @jax.jit
    def ref_step(params, state, x, y):
        grads = jax.grad(loss_fn)(params, x, y)
        updates, state = ref_tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    losses = []
    for s in range(steps):
        x, y = batch(s, r)
        params, state = step(params, state, x, y)
        xs, ys = zip(*[batch(s, k) for k in range(n)])
        all_x, all_y = np.concatenate(xs), np.concatenate(ys)
        ref_params, ref_state = ref_step(ref_params, ref_state, all_x, all_y)
        losses.append(float(loss_fn(ref_params, *batch(99, 0, 64))))  # a fixed evaluation set
    return params, ref_params, losses


params, ref_out, losses = train(optax.adam(0.02), 1, params, ref_params)
for got, exp in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(ref_out)):
    assert_close(got, exp, "params vs single-process training", rtol=2e-4, atol=2e-5)
digests = nj.allgather_object(digest(params))
if len(set(digests)) != 1:
    fail(f"parameters differ across ranks: {digests}")
if not losses[-1] < losses[0]:
    fail(f"loss did not fall: {losses}")
report("DistributedOptimizer")

params2, ref2, _ = train(optax.sgd(0.1), 2, params, params)
for got, exp in zip(jax.tree_util.tree_leaves(params2), jax.tree_util.tree_leaves(ref2)):
    assert_close(got, exp, "params with backward_passes_per_step=2", rtol=2e-4, atol=2e-5)
if len(set(nj.allgather_object(digest(params2)))) != 1:
    fail("parameters differ across ranks with backward_passes_per_step=2")
report("backward_passes_per_step")

obj = nj.broadcast_object({"rank": r, "arr": jnp.arange(3) * r}, root_rank=n - 1)
if obj["rank"] != n - 1 or not np.array_equal(np.asarray(obj["arr"]), np.arange(3) * (n - 1)):
    fail(f"broadcast_object returned {obj}")
if nj.allgather_object(("r", r)) != [("r", k) for k in range(n)]:
    fail("allgather_object")
report("objects")
nj.shutdown()
