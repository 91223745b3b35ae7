"""Every collective x dtype against a plain-torch reference computed from all ranks' inputs.

Each rank can regenerate any rank's input (seeded by rank), so the expected result is computed
locally with torch over the stacked inputs, independently of Nezha.
"""

import torch

import nezha.torch as hvd
from common import assert_close, fail, report

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INTS = [torch.uint8, torch.int8, torch.int32, torch.int64]
TOLERANCE = {torch.float16: 2e-3, torch.bfloat16: 2e-2, torch.float32: 1e-5,
             torch.float64: 1e-12}


def make(rank, shape, dtype, seed, low=-4, high=5):
    g = torch.Generator().manual_seed(1000 * seed + rank)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        return (torch.rand(shape, generator=g, dtype=torch.float64) * (high - low) + low).to(dtype)
    low = max(low, 0) if dtype == torch.uint8 else low
    return torch.randint(low, high, shape, generator=g).to(dtype)


def reference_reduce(inputs, op, dtype, pre=1.0, post=1.0):
    wide = torch.stack([x.double() if dtype.is_floating_point else x.long() for x in inputs])
    wide = wide * pre if pre != 1.0 else wide
    if op == hvd.Sum:
        r = wide.sum(0)
    elif op == hvd.Average:
        r = wide.sum(0) / len(inputs)
    elif op == hvd.Min:
        r = wide.min(0).values
    elif op == hvd.Max:
        r = wide.max(0).values
    else:
        r = wide.prod(0)
    r = r * post if post != 1.0 else r
    return r.to(dtype)


def check(actual, expected, what):
    tol = TOLERANCE.get(expected.dtype, 0)
    assert_close(actual, expected, what, rtol=tol, atol=tol)


def test_allreduce(rank, size):
    shape = (3, 5)
    for dtype in FLOATS + INTS:
        ops = [hvd.Sum, hvd.Min, hvd.Max, hvd.Product] + ([hvd.Average] if dtype.is_floating_point else [])
        for i, op in enumerate(ops):
            seed = 10 + i
            low, high = (1, 3) if op == hvd.Product else (-4, 5)
            inputs = [make(r, shape, dtype, seed, low, high) for r in range(size)]
            x = inputs[rank].clone()
            expected = reference_reduce(inputs, op, dtype)
            check(hvd.allreduce(x, op=op), expected, "allreduce %s %s" % (dtype, op))
            assert_close(x, inputs[rank], "allreduce must not modify its input")
            hvd.allreduce_(x, op=op, name="inplace.%s.%s" % (dtype, op))
            check(x, expected, "allreduce_ %s %s" % (dtype, op))
            handle = hvd.allreduce_async(inputs[rank], op=op)
            check(hvd.synchronize(handle), expected, "allreduce_async %s %s" % (dtype, op))
            if not hvd.poll(handle):
                fail("poll() is False after synchronize()")
        report("allreduce %s" % dtype)
    for dtype in [torch.bool]:
        inputs = [make(r, shape, dtype, 7) for r in range(size)]
        check(hvd.allreduce(inputs[rank], op=hvd.Max), torch.stack(inputs).any(0), "bool max")
        check(hvd.allreduce(inputs[rank], op=hvd.Min), torch.stack(inputs).all(0), "bool min")
    report("allreduce bool")


def test_allreduce_variants(rank, size):
    inputs = [make(r, (4, 6), torch.float32, 20) for r in range(size)]
    expected = reference_reduce(inputs, hvd.Sum, torch.float32, pre=0.5, post=3.0)
    got = hvd.allreduce(inputs[rank], op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
    check(got, expected, "allreduce pre/postscale")
    check(hvd.allreduce(inputs[rank], average=False), reference_reduce(inputs, hvd.Sum, torch.float32),
          "allreduce average=False")
    # Non-contiguous tensors: reduced through a contiguous copy, in-place result written back.
    full = [make(r, (6, 4), torch.float32, 21) for r in range(size)]
    view = full[rank].clone().t()
    hvd.allreduce_(view, op=hvd.Sum)
    check(view, reference_reduce([f.t() for f in full], hvd.Sum, torch.float32), "non-contiguous allreduce_")
    # Compression.fp16 on a float32 tensor: result is float32, as precise as fp16.
    got = hvd.allreduce(inputs[rank], compression=hvd.Compression.fp16)
    if got.dtype != torch.float32:
        fail("fp16-compressed allreduce returned %s" % got.dtype)
    assert_close(got, reference_reduce(inputs, hvd.Average, torch.float32), "fp16 compression",
                 rtol=3e-3, atol=3e-3)
    report("allreduce variants")

    for dtype in [torch.float32, torch.bfloat16, torch.int64]:
        group = [[make(r, s, dtype, 30 + j) for r in range(size)]
                 for j, s in enumerate([(2,), (3, 3), (1, 4, 2)])]
        mine = [g[rank].clone() for g in group]
        expected = [reference_reduce(g, hvd.Sum, dtype) for g in group]
        for got, exp in zip(hvd.grouped_allreduce(mine, op=hvd.Sum), expected):
            check(got, exp, "grouped_allreduce %s" % dtype)
        hvd.grouped_allreduce_(mine, op=hvd.Sum)
        for got, exp in zip(mine, expected):
            check(got, exp, "grouped_allreduce_ %s" % dtype)
        got = hvd.synchronize(hvd.grouped_allreduce_async([g[rank] for g in group], op=hvd.Sum))
        for g, exp in zip(got, expected):
            check(g, exp, "grouped_allreduce_async %s" % dtype)
    report("grouped_allreduce")


def test_allgather(rank, size):
    for dtype in FLOATS + INTS + [torch.bool]:
        inputs = [make(r, (r + 1, 3), dtype, 40) for r in range(size)]
        check(hvd.allgather(inputs[rank]), torch.cat(inputs), "allgather %s" % dtype)
        check(hvd.synchronize(hvd.allgather_async(inputs[rank])), torch.cat(inputs),
              "allgather_async %s" % dtype)
    pair = [[make(r, (2, 2), torch.float32, 41 + j) for r in range(size)] for j in range(2)]
    for got, parts in zip(hvd.grouped_allgather([p[rank] for p in pair]), pair):
        check(got, torch.cat(parts), "grouped_allgather")
    report("allgather")


def test_broadcast(rank, size):
    root = size - 1
    for dtype in FLOATS + INTS + [torch.bool]:
        inputs = [make(r, (2, 3), dtype, 50) for r in range(size)]
        check(hvd.broadcast(inputs[rank], root), inputs[root], "broadcast %s" % dtype)
        x = inputs[rank].clone()
        hvd.broadcast_(x, root)
        check(x, inputs[root], "broadcast_ %s" % dtype)
        y = inputs[rank].clone()
        hvd.synchronize(hvd.broadcast_async_(y, 0))
        check(y, inputs[0], "broadcast_async_ %s" % dtype)
    report("broadcast")


def test_alltoall(rank, size):
    for dtype in [torch.float32, torch.bfloat16, torch.int32, torch.uint8]:
        # Rank r sends (r + d + 1) rows to rank d.
        splits = [[r + d + 1 for d in range(size)] for r in range(size)]
        inputs = [make(r, (sum(splits[r]), 2), dtype, 60) for r in range(size)]
        expected = torch.cat([inputs[r][sum(splits[r][:rank]):sum(splits[r][:rank + 1])]
                              for r in range(size)])
        out, received = hvd.alltoall(inputs[rank], splits=torch.tensor(splits[rank]))
        check(out, expected, "alltoall %s" % dtype)
        check(received, torch.tensor([splits[r][rank] for r in range(size)], dtype=torch.int32),
              "alltoall received splits")
        even = [make(r, (2 * size, 3), dtype, 61) for r in range(size)]
        check(hvd.alltoall(even[rank]), torch.cat([e[2 * rank:2 * rank + 2] for e in even]),
              "alltoall equal splits %s" % dtype)
    report("alltoall")


def test_reducescatter(rank, size):
    rows = 2 * size + 1  # uneven: lower ranks get the extra row
    counts = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
    start = sum(counts[:rank])
    for dtype in [torch.float32, torch.float64, torch.bfloat16, torch.int32]:
        inputs = [make(r, (rows, 3), dtype, 70) for r in range(size)]
        for op in [hvd.Sum, hvd.Average] if dtype.is_floating_point else [hvd.Sum]:
            expected = reference_reduce(inputs, op, dtype)[start:start + counts[rank]]
            check(hvd.reducescatter(inputs[rank], op=op), expected, "reducescatter %s %s" % (dtype, op))
    pair = [[make(r, (rows, 2), torch.float32, 71 + j) for r in range(size)] for j in range(2)]
    got = hvd.grouped_reducescatter([p[rank] for p in pair], op=hvd.Sum)
    for g, parts in zip(got, pair):
        check(g, reference_reduce(parts, hvd.Sum, torch.float32)[start:start + counts[rank]],
              "grouped_reducescatter")
    report("reducescatter")


def test_sparse(rank, size):
    # Rows touched differ per rank and overlap, as an embedding's gradient rows do.
    dense = [torch.zeros(6, 3) for _ in range(size)]
    for r in range(size):
        for row in {r % 6, (2 * r + 1) % 6}:
            dense[r][row] = make(r, (3,), torch.float32, 90 + row)
    mine = dense[rank].to_sparse(1)
    for op in (hvd.Sum, hvd.Average):
        got = hvd.sparse_allreduce_async(mine, name="sparse.%s" % op, op=op)()
        if not got.is_sparse:
            fail("sparse_allreduce_async returned a dense tensor")
        check(got.to_dense(), reference_reduce(dense, op, torch.float32), "sparse_allreduce_async %s" % op)
    report("sparse allreduce")


def test_objects_and_sync(rank, size):
    obj = hvd.broadcast_object({"rank": rank, "blob": list(range(rank * 100))}, root_rank=size - 1)
    if obj != {"rank": size - 1, "blob": list(range((size - 1) * 100))}:
        fail("broadcast_object returned %r" % (obj,))
    gathered = hvd.allgather_object(("r", rank, "x" * rank))
    if gathered != [("r", r, "x" * r) for r in range(size)]:
        fail("allgather_object returned %r" % (gathered,))
    hvd.barrier()
    report("objects and barrier")


def test_errors(rank, size):
    try:
        hvd.allreduce(torch.zeros(2), op=hvd.Adasum)
        fail("Adasum did not raise")
    except NotImplementedError:
        pass
    try:
        hvd.allreduce(torch.zeros(2, dtype=torch.complex64))
        fail("complex64 did not raise")
    except TypeError:
        pass
    # A shape mismatch across ranks must raise on every rank, naming the tensor.
    try:
        hvd.allreduce(torch.ones(3 + rank), name="mismatched")
        fail("shape mismatch did not raise")
    except hvd.NezhaError as error:
        if "mismatched" not in str(error):
            fail("mismatch error does not name the tensor: %s" % error)
    # Process sets: a duplicate of the global one and an unregistered one are refused clearly.
    for attempt in (lambda: hvd.add_process_set(hvd.ProcessSet(list(range(size)))),
                    lambda: hvd.allreduce(torch.ones(2), process_set=hvd.ProcessSet([0]))):
        try:
            attempt()
            fail("a duplicate or unregistered process set did not raise")
        except ValueError as error:
            if "[0" not in str(error):
                fail("process set error does not name its ranks: %s" % error)
    # The engine is still usable afterwards.
    check(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(size)), "after error")
    report("errors")


def main():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if size < 2:
        fail("run with at least 2 ranks")
    test_allreduce(rank, size)
    test_allreduce_variants(rank, size)
    test_allgather(rank, size)
    test_broadcast(rank, size)
    test_alltoall(rank, size)
    test_reducescatter(rank, size)
    test_sparse(rank, size)
    test_objects_and_sync(rank, size)
    test_errors(rank, size)
    hvd.shutdown()


if __name__ == "__main__":
    main()
