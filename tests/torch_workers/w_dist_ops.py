"""Every torch.distributed operation on the backend "nezha", each result against a torch reference
computed here from every rank's inputs; sync and async_op=True, futures, coalescing, sub-groups,
point-to-point. Runs on 3 or 4 ranks under nezharun or torchrun (argv[1]: how it was launched,
printed in the first check)."""

import sys
import time

import torch
import torch.distributed as dist

from dist_common import assert_equal, assert_identical_on_all_ranks, expect, fail, report, value
from nezha.bench.thread_stats import context_switches

R = dist.ReduceOp


def all_inputs(tag, shape, dtype, ranks=None):
    return [value(r, tag, shape, dtype) for r in (ranks if ranks is not None else range(N))]


def reference(op, inputs, factor=None):
    stacked = torch.stack(inputs)
    if op == R.SUM:
        return stacked.sum(0).to(inputs[0].dtype)
    if op == R.AVG:
        return (stacked.sum(0) / len(inputs)).to(inputs[0].dtype)
    if op == R.MIN:
        return stacked.min(0).values
    if op == R.MAX:
        return stacked.max(0).values
    if op == R.PRODUCT:
        return stacked.prod(0).to(inputs[0].dtype)
    return (stacked * factor).sum(0).to(inputs[0].dtype)


def check_init():
    expect(dist.get_backend() == "nezha", "backend is %s" % dist.get_backend())
    expect(dist.get_world_size() == N, "world size")
    report("init under %s" % LAUNCHER)


def check_allreduce():
    tag = 0
    cases = [(torch.float32, [R.SUM, R.AVG, R.MIN, R.MAX, R.PRODUCT]),
             (torch.float64, [R.SUM, R.AVG, R.MAX]), (torch.float16, [R.SUM, R.MIN]),
             (torch.bfloat16, [R.SUM, R.MAX]), (torch.int32, [R.SUM, R.MIN, R.MAX, R.PRODUCT]),
             (torch.int64, [R.SUM, R.MAX]), (torch.uint8, [R.MAX, R.MIN]),
             (torch.int8, [R.SUM]), (torch.int16, [R.MIN]), (torch.bool, [R.MAX, R.MIN]),
             (torch.complex64, [R.SUM, R.AVG])]
    for dtype, ops in cases:
        for op in ops:
            tag += 1
            inputs = all_inputs(tag, (5, 7), dtype)
            t = inputs[RANK].clone()
            dist.all_reduce(t, op=op)
            exact = not (dtype.is_floating_point or dtype.is_complex) or op in (R.MIN, R.MAX)
            assert_equal(t, reference(op, inputs), "all_reduce %s %s" % (dtype, op),
                         exact=exact, rtol=1e-2 if dtype in (torch.float16, torch.bfloat16)
                         else 1e-6)
            assert_identical_on_all_ranks([t], "all_reduce %s %s" % (dtype, op))
    # PREMUL_SUM (what FSDP2 uses for its gradient divide), with a float and a tensor factor.
    for factor in (0.25, torch.tensor(0.5)):
        tag += 1
        inputs = all_inputs(tag, (9,), torch.float32)
        t = inputs[RANK].clone()
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(factor))
        f = float(factor)
        assert_equal(t, reference(None, inputs, f), "premul_sum %s" % f, exact=False)
    # A non-contiguous tensor is reduced in place too.
    base = all_inputs(99, (6, 4), torch.float64)
    t = base[RANK].clone().t()
    dist.all_reduce(t)
    assert_equal(t, reference(R.SUM, base).t(), "all_reduce of a transposed view")
    report("all_reduce every op x dtype")


def check_async_and_futures():
    inputs = all_inputs(200, (1000,), torch.float32)
    t = inputs[RANK].clone()
    work = dist.all_reduce(t, async_op=True)
    chained = work.get_future().then(lambda fut: fut.value()[0] * 2)
    expect(work.wait(), "wait() returns True")
    want = reference(R.SUM, inputs)
    assert_equal(t, want, "async all_reduce")
    expect(work.is_completed() and work.is_success() and work.exception() is None,
           "completed work state")
    expect(work.result()[0] is t, "result() is the tensor")
    expect(work.get_future().value()[0] is t, "future's value is the list of outputs")
    assert_equal(chained.wait(), want * 2, "then() on the future")
    # Many operations in flight at once, waited for in reverse order.
    works, tensors = [], []
    for i in range(24):
        x = value(RANK, 300 + i, (17 + i,), torch.float64)
        tensors.append(x)
        works.append(dist.all_reduce(x, async_op=True))
    for w in reversed(works):
        w.wait()
    for i, x in enumerate(tensors):
        assert_equal(x, reference(R.SUM, all_inputs(300 + i, (17 + i,), torch.float64)),
                     "in flight %d" % i)
    report("async works and futures")


def check_sync_calls_lead():
    """torch says which calls are waited for at once (opts.asyncOp): those lead the engine's loop
    on the caller's thread, so a worker's engine thread sleeps through 30 of them (it wakes for each
    asynchronous one), and the completer's threads are not woken for them either."""
    dist.barrier()
    t = torch.ones(2)
    before = context_switches("nz-engine"), context_switches("nz-torch-done")
    for i in range(30):
        t.fill_(i + RANK)
        dist.all_reduce(t)
        assert_equal(t, torch.full((2,), float(N * i + N * (N - 1) // 2)), "synchronous all_reduce %d" % i)
    engine, done = (a - b for a, b in zip((context_switches("nz-engine"), context_switches("nz-torch-done")),
                                          before))
    if RANK != 0:
        expect(engine < 15, "30 synchronous all_reduces: the engine thread switched %d times" % engine)
        expect(done < 15, "30 synchronous all_reduces: the completer's threads switched %d times" % done)
    dist.barrier()
    before = context_switches("nz-engine")
    for i in range(30):
        dist.all_reduce(t, async_op=True).wait()
    engine = context_switches("nz-engine") - before
    if RANK != 0:
        expect(engine >= 30, "30 asynchronous all_reduces: the engine thread switched only %d times"
               % engine)
    # Such a work seen by someone else than its waiter still completes: through its future (then
    # tracked by the completer) or by polling is_completed().
    opts = dist.AllreduceOptions()
    opts.asyncOp = False
    group = dist.group.WORLD
    u = torch.full((3,), float(RANK))
    def within_30_s(done):
        deadline = time.monotonic() + 30
        while not done() and time.monotonic() < deadline:
            time.sleep(0.001)
        return done()

    fut = group.allreduce([u], opts).get_future()
    expect(within_30_s(fut.done), "a synchronous work's future never completed")
    assert_equal(fut.value()[0], torch.full((3,), float(N * (N - 1) // 2)), "a synchronous work's future")
    v = torch.full((3,), 1.0)
    work = group.allreduce([v], opts)
    expect(within_30_s(work.is_completed), "a synchronous work polled with is_completed() never completed")
    assert_equal(v, torch.full((3,), float(N)), "a synchronous work polled with is_completed()")
    report("synchronous calls lead the engine's loop")


def check_coalesced():
    inputs = [all_inputs(400 + i, (3 + i, 2), torch.float32) for i in range(5)]
    tensors = [inp[RANK].clone() for inp in inputs]
    dist.all_reduce_coalesced(tensors, op=R.MAX)
    for t, inp in zip(tensors, inputs):
        assert_equal(t, reference(R.MAX, inp), "all_reduce_coalesced")
    from torch.distributed.distributed_c10d import _coalescing_manager
    tensors = [inp[RANK].clone() for inp in inputs]
    with _coalescing_manager(async_ops=True) as cm:
        for t in tensors:
            dist.all_reduce(t)
    cm.wait()
    for t, inp in zip(tensors, inputs):
        assert_equal(t, reference(R.SUM, inp), "coalescing manager all_reduce")
    outs = [torch.empty(N * 6) for _ in range(3)]
    with _coalescing_manager():
        for i, o in enumerate(outs):
            dist.all_gather_into_tensor(o, value(RANK, 450 + i, (6,), torch.float32))
    for i, o in enumerate(outs):
        assert_equal(o, torch.cat(all_inputs(450 + i, (6,), torch.float32)), "coalesced gather")
    outs = [torch.empty(4, dtype=torch.float64) for _ in range(3)]
    with _coalescing_manager():
        for i, o in enumerate(outs):
            dist.reduce_scatter_tensor(o, value(RANK, 470 + i, (4 * N,), torch.float64),
                                       op=R.AVG)
    for i, o in enumerate(outs):
        want = reference(R.AVG, all_inputs(470 + i, (4 * N,), torch.float64))[4 * RANK:4 * RANK + 4]
        assert_equal(o, want, "coalesced reduce_scatter", exact=False)
    # start/end coalescing with a device: mixed operations submitted together.
    group = dist.group.WORLD
    group._start_coalescing(torch.device("cpu"))
    a, b = value(RANK, 480, (5,), torch.float32), torch.full((3,), float(RANK))
    dist.all_reduce(a)
    dist.broadcast(b, src=N - 1)
    work = group._end_coalescing(torch.device("cpu"))
    work.wait()
    assert_equal(a, reference(R.SUM, all_inputs(480, (5,), torch.float32)), "coalesced mix a")
    assert_equal(b, torch.full((3,), float(N - 1)), "coalesced mix b")
    report("coalesced operations")


def check_broadcast():
    for root in range(N):
        for dtype in (torch.float32, torch.complex128, torch.uint16, torch.float8_e4m3fn,
                      torch.int64):
            src = value(root, 500 + root, (4, 3), dtype if dtype != torch.float8_e4m3fn
                        else torch.float32).to(dtype)
            t = src.clone() if RANK == root else torch.zeros_like(src)
            dist.broadcast(t, src=root)
            assert_equal(t.view(torch.uint8), src.view(torch.uint8),
                         "broadcast %s from %d" % (dtype, root))
    t = torch.zeros(8, 6, dtype=torch.float64)[:, ::2]  # a strided view: written back in place
    src = value(1, 550, (8, 3), torch.float64)
    if RANK == 1:
        t.copy_(src)
    dist.broadcast(t, src=1)
    assert_equal(t, src, "broadcast into a strided view")
    report("broadcast every root and dtype")


def check_allgather():
    inputs = all_inputs(600, (3, 2), torch.float32)
    outs = [torch.empty(3, 2) for _ in range(N)]
    dist.all_gather(outs, inputs[RANK])
    for r in range(N):
        assert_equal(outs[r], inputs[r], "all_gather[%d]" % r)
    out = torch.empty(N * 3, 2, dtype=torch.complex64)
    inputs = all_inputs(601, (3, 2), torch.complex64)
    dist.all_gather_into_tensor(out, inputs[RANK])
    assert_equal(out, torch.cat(inputs), "all_gather_into_tensor complex")
    out = torch.empty(N, 5, dtype=torch.int32)
    inputs = all_inputs(602, (5,), torch.int32)
    w = dist.all_gather_into_tensor(out, inputs[RANK], async_op=True)
    w.get_future().wait()
    assert_equal(out, torch.stack(inputs), "all_gather_into_tensor stacked")
    objects = [None] * N
    dist.all_gather_object(objects, {"rank": RANK, "s": "x" * (RANK * 50)})
    expect(objects == [{"rank": r, "s": "x" * (r * 50)} for r in range(N)], "all_gather_object")
    report("all_gather lists, tensors, objects")


def check_reduce_scatter():
    inputs = [all_inputs(700 + r, (4,), torch.float32) for r in range(N)]  # [dest][src]
    out = torch.empty(4)
    dist.reduce_scatter(out, [inputs[d][RANK] for d in range(N)], op=R.SUM)
    assert_equal(out, reference(R.SUM, inputs[RANK]), "reduce_scatter list")
    big = all_inputs(750, (N * 5, 3), torch.float64)
    out = torch.empty(5, 3, dtype=torch.float64)
    dist.reduce_scatter_tensor(out, big[RANK], op=R.AVG)
    want = reference(R.AVG, big)[5 * RANK:5 * RANK + 5]
    assert_equal(out, want, "reduce_scatter_tensor AVG", exact=False)
    out = torch.empty(5, 3, dtype=torch.float64)
    dist.reduce_scatter_tensor(out, big[RANK], op=dist._make_nccl_premul_sum(1.0 / N))
    assert_equal(out, want, "reduce_scatter_tensor PREMUL_SUM", exact=False)
    report("reduce_scatter list and tensor")


def check_all_to_all():
    # Uneven splits: rank s sends (s + d) % 3 + 1 rows to rank d.
    rows = [[(s + d) % 3 + 1 for d in range(N)] for s in range(N)]
    inputs = [value(s, 800 + s, (sum(rows[s]), 2), torch.float32) for s in range(N)]
    out = torch.empty(sum(rows[s][RANK] for s in range(N)), 2)
    dist.all_to_all_single(out, inputs[RANK], output_split_sizes=[rows[s][RANK] for s in range(N)],
                           input_split_sizes=rows[RANK])
    parts = []
    for s in range(N):
        first = sum(rows[s][:RANK])
        parts.append(inputs[s][first:first + rows[s][RANK]])
    assert_equal(out, torch.cat(parts), "all_to_all_single uneven")
    even = all_inputs(850, (N * 2, 3), torch.int64)
    out = torch.empty(N * 2, 3, dtype=torch.int64)
    dist.all_to_all_single(out, even[RANK])
    assert_equal(out, torch.cat([even[s][2 * RANK:2 * RANK + 2] for s in range(N)]),
                 "all_to_all_single even")
    ins = [value(RANK, 900 + d, (d + 1, RANK + 1), torch.float64) for d in range(N)]
    outs = [torch.empty(RANK + 1, s + 1, dtype=torch.float64) for s in range(N)]
    dist.all_to_all(outs, ins)
    for s in range(N):
        assert_equal(outs[s], value(s, 900 + RANK, (RANK + 1, s + 1), torch.float64),
                     "all_to_all from %d" % s)
    report("all_to_all single and lists")


def check_gather_scatter_reduce():
    for root in range(N):
        inputs = all_inputs(1000 + root, (3,), torch.float32)
        outs = [torch.empty(3) for _ in range(N)] if RANK == root else None
        dist.gather(inputs[RANK], outs, dst=root)
        if RANK == root:
            for r in range(N):
                assert_equal(outs[r], inputs[r], "gather to %d [%d]" % (root, r))
        parts = all_inputs(1100 + root, (2, 2), torch.int32)
        out = torch.empty(2, 2, dtype=torch.int32)
        dist.scatter(out, parts if RANK == root else None, src=root)
        assert_equal(out, parts[RANK], "scatter from %d" % root)
        inputs = all_inputs(1200 + root, (6,), torch.float64)
        t = inputs[RANK].clone()
        dist.reduce(t, dst=root, op=R.MAX)
        if RANK == root:
            assert_equal(t, reference(R.MAX, inputs), "reduce to %d" % root)
    objs = [None]
    dist.scatter_object_list(objs, [{"to": r} for r in range(N)] if RANK == 0 else None, src=0)
    expect(objs[0] == {"to": RANK}, "scatter_object_list")
    got = [None] * N if RANK == N - 1 else None
    dist.gather_object(("r", RANK), got, dst=N - 1)
    expect(RANK != N - 1 or got == [("r", r) for r in range(N)], "gather_object")
    objs = ["from root", 3] if RANK == 0 else [None, None]
    dist.broadcast_object_list(objs, src=0)
    expect(objs == ["from root", 3], "broadcast_object_list")
    dist.barrier()
    report("gather, scatter, reduce, object lists, barrier")


def check_point_to_point():
    nxt, prv = (RANK + 1) % N, (RANK - 1) % N
    # A ring with isend/irecv, two tags, one transfer large enough to be striped.
    for tag, shape in ((0, (10,)), (5, (1 << 19,))):
        send = value(RANK, 1300 + tag, shape, torch.float32)
        recv = torch.empty(shape)
        reqs = [dist.isend(send, dst=nxt, tag=tag), dist.irecv(recv, src=prv, tag=tag)]
        for q in reqs:
            q.wait()
        assert_equal(recv, value(prv, 1300 + tag, shape, torch.float32), "ring tag %d" % tag)
    # batch_isend_irecv both ways round the ring.
    a, b = torch.empty(4, dtype=torch.int64), torch.empty(4, dtype=torch.int64)
    ops = [dist.P2POp(dist.isend, torch.full((4,), RANK * 10), nxt),
           dist.P2POp(dist.irecv, a, prv),
           dist.P2POp(dist.isend, torch.full((4,), RANK * 10 + 1), prv),
           dist.P2POp(dist.irecv, b, nxt)]
    for q in dist.batch_isend_irecv(ops):
        q.wait()
    assert_equal(a, torch.full((4,), prv * 10), "batch from prev")
    assert_equal(b, torch.full((4,), nxt * 10 + 1), "batch from next")
    # Blocking send/recv between two ranks only, while the others do nothing.
    if RANK == 0:
        dist.send(torch.arange(7, dtype=torch.float64), dst=N - 1)
        back = torch.empty(2, dtype=torch.complex64)
        dist.recv(back, src=N - 1)
        assert_equal(back, torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64), "reply")
    elif RANK == N - 1:
        x = torch.empty(7, dtype=torch.float64)
        dist.recv(x, src=0)
        assert_equal(x, torch.arange(7, dtype=torch.float64), "send/recv")
        dist.send(torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64), dst=0)
    # An earlier receive that a later send of this very rank enables must not deadlock.
    if RANK in (0, 1):
        peer = 1 - RANK
        got = torch.empty(3)
        if RANK == 0:
            early = dist.irecv(got, src=peer)
            dist.send(torch.ones(3), dst=peer)
            early.wait()
        else:
            dist.recv(got, src=peer)
            dist.send(torch.ones(3) * 2, dst=peer)
        assert_equal(got, torch.ones(3) * (2 if RANK == 0 else 1), "receive before send")
    dist.barrier()
    report("point-to-point")


def check_groups():
    evens = dist.new_group([r for r in range(N) if r % 2 == 0])
    tail = dist.new_group(list(range(1, N)))
    evens_again = dist.new_group([r for r in range(N) if r % 2 == 0])
    members = [r for r in range(N) if r % 2 == 0]
    if RANK in members:
        inputs = all_inputs(1400, (5,), torch.float32, members)
        t = inputs[members.index(RANK)].clone()
        dist.all_reduce(t, group=evens)
        assert_equal(t, reference(R.SUM, inputs), "evens all_reduce")
        u = torch.full((2,), float(RANK))
        dist.broadcast(u, group_src=len(members) - 1, group=evens_again)
        assert_equal(u, torch.full((2,), float(members[-1])), "same ranks, second group")
        expect(dist.get_rank(evens) == members.index(RANK), "group rank")
    if RANK >= 1:
        ranks = list(range(1, N))
        outs = [torch.empty(2) for _ in ranks]
        dist.all_gather(outs, torch.full((2,), float(RANK)), group=tail)
        for i, r in enumerate(ranks):
            assert_equal(outs[i], torch.full((2,), float(r)), "tail all_gather")
        if RANK == 1:
            dist.send(torch.tensor([42.0]), group_dst=1, group=tail)
        elif RANK == 2:
            x = torch.empty(1)
            dist.recv(x, group_src=0, group=tail)
            assert_equal(x, torch.tensor([42.0]), "sub-group p2p")
    world_again = dist.new_group(list(range(N)))
    t = torch.ones(3)
    dist.all_reduce(t, group=world_again)
    assert_equal(t, torch.full((3,), float(N)), "a group of every rank")
    for g in (evens, tail, evens_again):
        if g != dist.GroupMember.NON_GROUP_MEMBER:
            dist.destroy_process_group(g)
    report("new_group sub-groups")
    if N == 4:
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("rep", "shard"))
        for dim in ("rep", "shard"):
            g = mesh.get_group(dim)
            ranks = dist.get_process_group_ranks(g)
            t = torch.full((2,), float(RANK))
            dist.all_reduce(t, group=g)
            assert_equal(t, torch.full((2,), float(sum(ranks))), "mesh %s" % dim)
        report("2-D DeviceMesh groups")


def check_errors():
    for bad, what in ((lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32),
                                               op=R.BAND), "BAND"),
                      (lambda: dist.all_reduce(torch.ones(2, dtype=torch.complex64),
                                               op=R.MAX), "complex MAX"),
                      (lambda: dist.all_gather_into_tensor(torch.empty(3), torch.ones(2)),
                       "all_gather_into_tensor sizes"),
                      (lambda: dist.all_to_all_single(torch.empty(4), torch.empty(N + 1)),
                       "uneven all_to_all without splits"),
                      (lambda: dist.recv(torch.empty(1)), "recv from any source"),
                      # (ranks outside the group return before torch asks the backend)
                      (lambda: dist.new_group([0, 1], use_local_synchronization=True)
                       if RANK < 2 else dist.recv(torch.empty(1)), "use_local_synchronization")):
        try:
            bad()
        except (ValueError, TypeError, NotImplementedError, RuntimeError) as exc:
            expect("nezha" in str(exc) or "must" in str(exc) or "support" in str(exc)
                   or "divide" in str(exc), "%s: unclear message %r" % (what, str(exc)))
        else:
            fail("%s did not raise" % what)
    t = torch.ones(3)
    dist.all_reduce(t)
    assert_equal(t, torch.full((3,), float(N)), "after refused calls")
    report("bad input raises at the call")


LAUNCHER = sys.argv[1] if len(sys.argv) > 1 else "?"
dist.init_process_group("nezha")
RANK, N = dist.get_rank(), dist.get_world_size()
try:
    for check in (check_init, check_allreduce, check_async_and_futures, check_sync_calls_lead,
                  check_coalesced,
                  check_broadcast, check_allgather, check_reduce_scatter, check_all_to_all,
                  check_gather_scatter_reduce, check_point_to_point, check_groups, check_errors):
        check()
finally:
    dist.destroy_process_group()
