"""Gradients of the synchronous collectives against hand-derived references (Horovod conventions).

Every rank r weights the op's output with its own W_r, so the expected gradient of the sum of all
ranks' losses is a known function of all W_r, computed locally from the seeds.
"""

import torch

import nezha.torch as hvd
from common import assert_close, report


def weights(rank, shape, seed):
    return torch.rand(shape, generator=torch.Generator().manual_seed(500 * seed + rank),
                      dtype=torch.float64)


def leaf(rank, shape, seed):
    return (weights(rank, shape, seed + 99) * 4 - 2).requires_grad_()


def main():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    shape = (3, 4)

    for op, combine in [(hvd.Sum, lambda ws: sum(ws)), (hvd.Average, lambda ws: sum(ws) / n)]:
        x = leaf(r, shape, 1)
        (hvd.allreduce(x, op=op) * weights(r, shape, 2)).sum().backward()
        assert_close(x.grad, combine([weights(k, shape, 2) for k in range(n)]), "allreduce %s grad" % op)
    xs = [leaf(k, shape, 3) for k in range(n)]
    (hvd.allreduce(xs[r], op=hvd.Max) * weights(r, shape, 4)).sum().backward()
    is_max = (xs[r] == torch.stack([x.detach() for x in xs]).max(0).values).double()
    assert_close(xs[r].grad, sum(weights(k, shape, 4) for k in range(n)) * is_max, "allreduce Max grad")
    report("allreduce grad")

    rows = [k + 1 for k in range(n)]
    x = leaf(r, (rows[r], 2), 5)
    (hvd.allgather(x) * weights(r, (sum(rows), 2), 6)).sum().backward()
    avg = sum(weights(k, (sum(rows), 2), 6) for k in range(n)) / n
    assert_close(x.grad, avg[sum(rows[:r]):sum(rows[:r + 1])], "allgather grad")
    report("allgather grad")

    root = n - 1
    x = leaf(r, shape, 7)
    (hvd.broadcast(x, root) * weights(r, shape, 8)).sum().backward()
    expected = sum(weights(k, shape, 8) for k in range(n)) / n if r == root else torch.zeros(shape, dtype=torch.float64)
    assert_close(x.grad, expected, "broadcast grad")
    report("broadcast grad")

    x = leaf(r, (2 * n, 3), 9)
    out = hvd.alltoall(x)
    (out * weights(r, (2 * n, 3), 10)).sum().backward()
    # Rows 2d..2d+1 of my input went to rank d, where they are rows 2r..2r+1 of its output.
    expected = torch.cat([weights(d, (2 * n, 3), 10)[2 * r:2 * r + 2] for d in range(n)])
    assert_close(x.grad, expected, "alltoall grad")
    report("alltoall grad")

    # Horovod's definition (not the derivative): the allgathered gradient times size for Sum, the
    # allgathered gradient itself for Average.
    for op, scale in [(hvd.Sum, float(n)), (hvd.Average, 1.0)]:
        x = leaf(r, (2 * n, 3), 11)
        (hvd.reducescatter(x, op=op) * weights(r, (2, 3), 12)).sum().backward()
        expected = torch.cat([weights(d, (2, 3), 12) for d in range(n)]) * scale
        assert_close(x.grad, expected, "reducescatter %s grad" % op)
    report("reducescatter grad")

    a, b = leaf(r, (2,), 13), leaf(r, (3, 2), 14)
    ga, gb = hvd.grouped_allreduce([a, b], op=hvd.Sum)
    ((ga * weights(r, (2,), 15)).sum() + (gb * weights(r, (3, 2), 16)).sum()).backward()
    assert_close(a.grad, sum(weights(k, (2,), 15) for k in range(n)), "grouped_allreduce grad a")
    assert_close(b.grad, sum(weights(k, (3, 2), 16) for k in range(n)), "grouped_allreduce grad b")
    report("grouped_allreduce grad")
    hvd.shutdown()


if __name__ == "__main__":
    main()
