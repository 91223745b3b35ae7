"""nezha.jax collectives in process sets (3 ranks): sets {0, 2} and {1, 2} registered at init, every
collective eager and inside jit among a set's members against numpy, a gradient through a set's
allreduce, two sets' jitted collectives at once on rank 2 beside a global one, a rank outside a
set refused, and DistributedOptimizer of a set leaving the outsider's updates its own."""
import sys

import numpy as np

from common import assert_close, expect_error, fail, report

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

import nezha.jax as nj  # noqa: E402

a, b = nj.ProcessSet([0, 2]), nj.ProcessSet([1, 2])
nj.init(process_sets=[a, b])
r, n = nj.rank(), nj.size()
if n != 3:
    fail("this worker needs 3 ranks, got %d" % n)
MODE = sys.argv[1] if len(sys.argv) > 1 else "ffi"
if MODE == "ffi" and not nj.ffi_available():
    fail("this build has no FFI handlers; the test expects them")


def value(k, shape, salt=0):
    return (np.arange(np.prod(shape), dtype=np.float32).reshape(shape) * (k + 1) + salt).astype(np.float32)


members = a.ranks
if r in members:
    # allreduce of a pytree, eager and jitted
    tree = {"w": jnp.asarray(value(r, (3, 4))), "b": jnp.asarray(value(r, (5,), 1))}
    want = {k: sum(value(m, v.shape, 0 if k == "w" else 1) for m in members) for k, v in tree.items()}
    for got, how in ((nj.allreduce(tree, op=nj.Sum, process_set=a), "eager"),
                     (jax.jit(lambda t: nj.allreduce(t, op=nj.Sum, process_set=a))(tree), "jit")):
        for k in tree:
            assert_close(np.asarray(got[k]), want[k], "set allreduce %s %s" % (k, how))
    avg = jax.jit(lambda t: nj.allreduce(t, op=nj.Average, process_set=a))(tree["w"])
    assert_close(np.asarray(avg), want["w"] / 2, "set allreduce Average (1/2, not 1/3)")
    # allgather: members' rows in rank order; eager dim 0 may differ
    rows = jnp.asarray(value(r, (r + 1, 2)))
    want_ag = np.concatenate([value(m, (m + 1, 2)) for m in members])
    assert_close(np.asarray(nj.allgather(rows, process_set=a)), want_ag, "set allgather eager")
    same = jnp.asarray(value(r, (2, 2)))
    got = jax.jit(lambda t: nj.allgather(t, process_set=a))(same)
    assert_close(np.asarray(got), np.concatenate([value(m, (2, 2)) for m in members]), "set allgather jit")
    # broadcast from the set's last member (a job rank)
    for got, how in ((nj.broadcast(same, root_rank=2, process_set=a), "eager"),
                     (jax.jit(lambda t: nj.broadcast(t, root_rank=2, process_set=a))(same), "jit")):
        assert_close(np.asarray(got), value(2, (2, 2)), "set broadcast " + how)
    # reducescatter: 5 rows over 2 members (3 + 2)
    tall = jnp.asarray(value(r, (5, 3)))
    full = sum(value(m, (5, 3)) for m in members)
    mine = full[:3] if r == members[0] else full[3:]
    for got, how in ((nj.reducescatter(tall, op=nj.Sum, process_set=a), "eager"),
                     (jax.jit(lambda t: nj.reducescatter(t, op=nj.Sum, process_set=a))(tall), "jit")):
        assert_close(np.asarray(got), mine, "set reducescatter " + how)
    # alltoall: equal parts per member
    sq = jnp.asarray(value(r, (4, 2)))
    me = members.index(r)
    want_a2a = np.concatenate([value(m, (4, 2))[2 * me:2 * me + 2] for m in members])
    for got, how in ((nj.alltoall(sq, process_set=a), "eager"),
                     (jax.jit(lambda t: nj.alltoall(t, process_set=a))(sq), "jit")):
        assert_close(np.asarray(got), want_a2a, "set alltoall " + how)
    # a gradient through the set's allreduce: d/dx sum(allreduce_sum(x) * c) = allreduce_sum(c)
    c = jnp.asarray(value(r, (3,), 2))
    grad = jax.jit(jax.grad(lambda x: jnp.sum(nj.allreduce(x, op=nj.Sum, process_set=a) * c)))(
        jnp.ones(3, jnp.float32))
    assert_close(np.asarray(grad), sum(value(m, (3,), 2) for m in members), "gradient in a set")
    grad = jax.jit(jax.grad(lambda x: jnp.sum(nj.allgather(x, process_set=a) ** 2)))(same)
    assert_close(np.asarray(grad), 2 * np.asarray(same), "allgather gradient in a set")
else:
    expect_error(lambda: nj.allreduce(jnp.ones(3), process_set=a), "a rank outside the set",
                 "is not in")
    expect_error(lambda: jax.jit(lambda t: nj.allgather(t, process_set=a))(jnp.ones(2)),
                 "a rank outside the set, jitted", "is not in")
report("collectives in a set")

# Two sets' jitted collectives on rank 2 at once, beside a global one: every rank of each set
# gets its own set's sum.
step = jax.jit(lambda t: (nj.allreduce(t, op=nj.Sum, name="in.a", process_set=a) if r in a.ranks else t,
                          nj.allreduce(t, op=nj.Sum, name="in.b", process_set=b) if r in b.ranks else t,
                          nj.allreduce(t, op=nj.Sum, name="in.all")))
x = jnp.full(4, float(r + 1), jnp.float32)
got_a, got_b, got_all = step(x)
if r in a.ranks:
    assert_close(np.asarray(got_a), np.full(4, 1.0 + 3.0, np.float32), "set a's sum")
if r in b.ranks:
    assert_close(np.asarray(got_b), np.full(4, 2.0 + 3.0, np.float32), "set b's sum")
assert_close(np.asarray(got_all), np.full(4, 6.0, np.float32), "the job's sum")
report("overlapping sets")

# DistributedOptimizer of set a on every rank: members average over the set, rank 1 keeps its own.
opt = nj.DistributedOptimizer(optax.sgd(1.0), process_set=a)
params = {"p": jnp.zeros(2, jnp.float32)}
state = opt.init(params)
grads = {"p": jnp.full(2, float(r + 1), jnp.float32)}
updates, state = jax.jit(opt.update)(grads, state, params)
want = -np.full(2, (1.0 + 3.0) / 2 if r in a.ranks else r + 1.0, np.float32)
assert_close(np.asarray(updates["p"]), want, "DistributedOptimizer of a set")
report("optimizer of a set")
nj.barrier()
nj.shutdown()
