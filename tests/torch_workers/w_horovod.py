"""Horovod's torch semantics that scripts and test suites depend on (issue 16), Horovod-test style:
every case in the same processes, one after the other, each checked against a reference computed
here with plain torch from Horovod's documented rules (never with Nezha).
"""

import os

import numpy as np
import torch

import nezha.torch as hvd
from common import assert_close, fail, report

INT_TYPES = (torch.int16, torch.int32, torch.int64)


def case_launcher_environment(rank, size):
    for what, value in (("RANK", rank), ("SIZE", size), ("LOCAL_RANK", hvd.local_rank()),
                        ("LOCAL_SIZE", hvd.local_size()), ("CROSS_RANK", hvd.cross_rank()),
                        ("CROSS_SIZE", hvd.cross_size())):
        if int(os.environ["HOROVOD_" + what]) != value:
            fail("HOROVOD_%s=%s, hvd says %d" % (what, os.environ["HOROVOD_" + what], value))
    if not os.environ.get("HOROVOD_HOSTNAME"):
        fail("HOROVOD_HOSTNAME is not set")
    report("HOROVOD_* environment")


def case_int16(rank, size):
    parts = [torch.arange(6, dtype=torch.int16).reshape(3, 2) * (r + 1) - 3 for r in range(size)]
    assert_close(hvd.allgather(parts[rank]), torch.cat(parts), "int16 allgather")
    assert_close(hvd.broadcast(parts[rank], size - 1), parts[size - 1], "int16 broadcast")
    x = parts[rank].clone()
    hvd.broadcast_(x, 0)
    assert_close(x, parts[0], "int16 broadcast_")
    rows = [torch.full((size, 3), 10 * r + 1, dtype=torch.int16) for r in range(size)]
    expected = torch.cat([rows[r][rank:rank + 1] for r in range(size)])
    assert_close(hvd.alltoall(rows[rank]), expected, "int16 alltoall")
    total = torch.stack(parts).sum(0).to(torch.int16)
    assert_close(hvd.allreduce(parts[rank], op=hvd.Sum), total, "int16 allreduce")
    for op, ref in ((hvd.Min, torch.stack(parts).min(0).values),
                    (hvd.Max, torch.stack(parts).max(0).values)):
        assert_close(hvd.allreduce(parts[rank], op=op), ref, "int16 allreduce %s" % op)
    tall = [torch.arange(2 * size * 2, dtype=torch.int16).reshape(2 * size, 2) + r
            for r in range(size)]
    summed = torch.stack(tall).sum(0).to(torch.int16)
    assert_close(hvd.reducescatter(tall[rank], op=hvd.Sum), summed[2 * rank:2 * rank + 2],
                 "int16 reducescatter")
    report("int16")


def horovod_scaled(tensor, factor):
    """Horovod's CPU ScaleBuffer: in the tensor's dtype with the factor cast to it (float32,
    float64), in float32 for float16, in float64 truncated toward zero for integers."""
    if tensor.dtype in INT_TYPES:
        return (tensor.double() * torch.tensor(factor, dtype=torch.float64)).to(tensor.dtype)
    if tensor.dtype == torch.float16:
        return (tensor.float() * torch.tensor(factor, dtype=torch.float32)).half()
    return tensor * torch.tensor(factor, dtype=tensor.dtype)


def exactly(actual, expected, what):
    if actual.dtype != expected.dtype or not torch.equal(actual, expected):
        fail("%s:\n got      %s\n expected %s" % (what, actual, expected))


def case_scaling(rank, size):
    # As Horovod's test_horovod_allreduce_prescale/postscale: the same tensor on every rank, so the
    # sum is `size` times the scaled tensor, and the comparison is exact for 2-3 ranks.
    np.random.seed(1234)
    factor = np.random.uniform()
    for dtype in (torch.float16, torch.float32, torch.float64) + INT_TYPES:
        for dim in (1, 2, 3):
            torch.manual_seed(1234)
            tensor = torch.FloatTensor(*([size * 4] * dim)).random_(-100, 100).to(dtype)
            pre = hvd.allreduce(tensor, op=hvd.Sum, prescale_factor=factor)
            exactly(pre, horovod_scaled(tensor, factor) * size, "prescale %s %dd" % (dtype, dim))
            post = hvd.allreduce(tensor, op=hvd.Sum, postscale_factor=factor)
            exactly(post, horovod_scaled(tensor * size, factor), "postscale %s %dd" % (dtype, dim))
            avg = hvd.allreduce(tensor, op=hvd.Average, postscale_factor=factor)
            exactly(avg, horovod_scaled(tensor * size, factor / size), "average %s" % dtype)
            block = slice(rank * 4, (rank + 1) * 4)
            rs = hvd.reducescatter(tensor, op=hvd.Sum, prescale_factor=factor)
            exactly(rs, (horovod_scaled(tensor, factor) * size)[block], "reducescatter pre %s" % dtype)
            grouped = hvd.grouped_reducescatter([tensor, tensor[:size]], op=hvd.Sum,
                                                postscale_factor=factor)
            exactly(grouped[0], horovod_scaled(tensor * size, factor)[block],
                    "grouped_reducescatter post %s" % dtype)
            exactly(grouped[1], horovod_scaled(tensor[:size] * size, factor)[rank:rank + 1],
                    "grouped_reducescatter post (one row each) %s" % dtype)
    report("prescale and postscale")


def case_grouped_reducescatter(rank, size):
    # Horovod's test_horovod_grouped_reducescatter: 5 tensors per call, Sum and Average.
    for dtype in (torch.float16, torch.float32, torch.float64, torch.int32, torch.int64):
        for dim in (1, 2, 3):
            torch.manual_seed(1234)
            tensors = [torch.FloatTensor(*([size * 4] * dim)).random_(-100, 100).to(dtype)
                       for _ in range(5)]
            summed = hvd.grouped_reducescatter(tensors, op=hvd.Sum)
            for got, t in zip(summed, tensors):
                exactly(got, t[rank * 4:(rank + 1) * 4] * size, "grouped_reducescatter %s" % dtype)
            averaged = hvd.grouped_reducescatter(tensors, op=hvd.Average)
            for got, t in zip(averaged, tensors):
                exactly(got, t[rank * 4:(rank + 1) * 4], "grouped_reducescatter Average %s" % dtype)
    # Uneven first dimensions: lower ranks get the extra rows, as Horovod.
    tensors = [torch.arange(rows * 2, dtype=torch.float32).reshape(rows, 2) for rows in (1, 3, 7)]
    for got, t in zip(hvd.grouped_reducescatter(tensors, op=hvd.Sum), tensors):
        rows = t.shape[0]
        counts = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
        start = sum(counts[:rank])
        exactly(got, t[start:start + counts[rank]] * size, "grouped_reducescatter uneven")
    for attempt in (lambda: hvd.grouped_reducescatter([torch.tensor(float(rank))]),
                    lambda: hvd.grouped_reducescatter([torch.ones(size), torch.tensor(1.0)]),
                    lambda: hvd.reducescatter(torch.tensor(float(rank))),
                    lambda: hvd.reducescatter_async(torch.tensor(float(rank)))):
        try:
            attempt()
            fail("a 0-d tensor given to reducescatter did not raise")
        except ValueError:
            pass
    # Nothing was left in flight by the refusals: the next collective is in step.
    assert_close(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(size)),
                 "after scalar errors")
    report("grouped_reducescatter")


def _leaf(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g, dtype=torch.float64).requires_grad_()


def case_reducescatter_gradients(rank, size):
    # Horovod's definition: the incoming gradient times size (Sum only) times the prescale and
    # postscale factors, allgathered. Every rank feeds ones, as test_horovod_reducescatter_grad.
    for op, pre, post, factor in ((hvd.Sum, 1.0, 1.0, size), (hvd.Average, 1.0, 1.0, 1),
                                  (hvd.Sum, 0.5, 3.0, size * 1.5), (hvd.Average, 2.0, 1.0, 2.0)):
        x = _leaf((size * 4, 3), 1)
        out = hvd.reducescatter(x, op=op, prescale_factor=pre, postscale_factor=post)
        out.backward(torch.ones_like(out))
        assert_close(x.grad, torch.full((size * 4, 3), float(factor), dtype=torch.float64),
                     "reducescatter %s pre %s post %s grad" % (op, pre, post))
        xs = [_leaf((size * 2, 2), 2), _leaf((size, 5), 3)]
        outs = hvd.grouped_reducescatter(xs, op=op, prescale_factor=pre, postscale_factor=post)
        sum(o.sum() for o in outs).backward()
        for x in xs:
            assert_close(x.grad, torch.full_like(x, float(factor)),
                         "grouped_reducescatter %s grad" % op)
    report("reducescatter gradients")


def case_other_gradients(rank, size):
    # allreduce / grouped_allreduce: the gradient allreduced with the same op and factors.
    for op, factor in ((hvd.Sum, size * 0.5 * 3.0), (hvd.Average, 0.5 * 3.0)):
        x = _leaf((3,), 4)
        hvd.allreduce(x, op=op, prescale_factor=0.5, postscale_factor=3.0).sum().backward()
        assert_close(x.grad, torch.full((3,), factor, dtype=torch.float64), "allreduce %s grad" % op)
        xs = [_leaf((2,), 5), _leaf((2, 2), 6)]
        outs = hvd.grouped_allreduce(xs, op=op, prescale_factor=0.5, postscale_factor=3.0)
        sum(o.sum() for o in outs).backward()
        for x in xs:
            assert_close(x.grad, torch.full_like(x, factor), "grouped_allreduce %s grad" % op)
    # grouped_allreduce runs forward for every op, as Horovod's does; its Max gradient is
    # allreduce's (the summed gradient where this rank's value was the maximum).
    mins = hvd.grouped_allreduce([torch.full((2,), float(rank))], op=hvd.Min)
    assert_close(mins[0], torch.zeros(2), "grouped_allreduce Min")
    x = torch.full((2,), float(rank), dtype=torch.float64, requires_grad=True)
    hvd.grouped_allreduce([x], op=hvd.Max)[0].sum().backward()
    assert_close(x.grad, torch.full((2,), float(size) if rank == size - 1 else 0.0,
                                    dtype=torch.float64), "grouped_allreduce Max grad")
    # allgather / grouped_allgather: the averaged gradient, this rank's rows.
    xs = [_leaf((rank + 1, 2), 7), _leaf((2, 3), 8)]
    outs = hvd.grouped_allgather(xs)
    sum(o.sum() for o in outs).backward()
    for x in xs:
        assert_close(x.grad, torch.ones_like(x), "grouped_allgather grad")
    # broadcast: the averaged gradient on the root, zeros elsewhere.
    x = _leaf((3,), 9)
    hvd.broadcast(x, 0).sum().backward()
    assert_close(x.grad, torch.full((3,), 1.0 if rank == 0 else 0.0, dtype=torch.float64),
                 "broadcast grad")
    report("other gradients")


class _ModelNoGrad(torch.nn.Module):
    """Horovod's test_broadcast_state_no_grad model: one parameter that needs no gradient."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.tensor([1, 3], dtype=torch.int32), requires_grad=False)
        self.b = torch.nn.Parameter(torch.rand(4))

    def forward(self, x):
        return torch.index_select(self.b, 0, self.a.long()) * x


def case_broadcast_optimizer_state_without_grads(rank, size):
    model = _ModelNoGrad()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001, weight_decay=1e-6, momentum=0.9,
                                nesterov=True)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    before = model.b.detach().clone()
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    if optimizer.param_groups[0]["params"][0].grad is not None:
        fail("a parameter that requires no gradient was given one")
    grad = optimizer.param_groups[0]["params"][1].grad
    if grad is None:
        fail("broadcast_optimizer_state left grad None for a trainable parameter")
    assert_close(hvd.broadcast(grad, root_rank=0), grad, "broadcast of the materialized grad")
    assert_close(grad, torch.zeros(4), "materialized grad")
    assert_close(model.b, before, "parameters untouched by broadcast_optimizer_state")
    # Still trains afterwards, in step.
    optimizer.zero_grad()
    model(torch.full((2,), float(rank + 1))).sum().backward()
    optimizer.step()
    digests = hvd.allgather_object(model.b.detach().numpy().tobytes())
    if len(set(digests)) != 1:
        fail("replicas differ after a step")
    report("broadcast_optimizer_state without gradients")


def case_sparse_adam(rank, size):
    for sparse_as_dense in (False, True):
        torch.manual_seed(5)
        emb = torch.nn.Embedding(8, 3, sparse=True)
        reference = torch.nn.Embedding(8, 3, sparse=True)
        reference.load_state_dict(emb.state_dict())
        opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(emb.parameters(), lr=0.1),
                                       named_parameters=emb.named_parameters(),
                                       sparse_as_dense=sparse_as_dense)
        ref_opt = torch.optim.SparseAdam(reference.parameters(), lr=0.1)
        rows = [torch.tensor([r % 8, (3 * r + 1) % 8]) for r in range(size)]
        for _ in range(2):
            opt.zero_grad()
            emb(rows[rank]).sum().backward()
            opt.step()
            if not emb.weight.grad.is_sparse:
                fail("sparse_as_dense=%s left a dense gradient" % sparse_as_dense)
            # One process, the average of every rank's loss: what averaging gradients equals.
            ref_opt.zero_grad()
            (sum(reference(r).sum() for r in rows) / size).backward()
            ref_opt.step()
        assert_close(emb.weight, reference.weight, "SparseAdam sparse_as_dense=%s" % sparse_as_dense,
                     rtol=1e-5, atol=1e-6)
    report("SparseAdam with sparse gradients")


def case_api_forms(rank, size):
    # broadcast_parameters takes a plain list of tensors too (Horovod matches them by position).
    tensors = [torch.full((2,), float(rank)), torch.full((3,), float(rank + 10))]
    hvd.broadcast_parameters(tensors, root_rank=size - 1)
    assert_close(tensors[0], torch.full((2,), float(size - 1)), "broadcast_parameters list")
    assert_close(tensors[1], torch.full((3,), float(size + 9)), "broadcast_parameters list")
    # DistributedOptimizer's arguments bind positionally as in Horovod (num_groups before groups).
    model = torch.nn.Linear(2, 1)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   model.named_parameters(), hvd.Compression.none, 1, hvd.Sum,
                                   1.0, 0, None, False, hvd.global_process_set)
    if opt.op != hvd.Sum or opt.sparse_as_dense is not False:
        fail("DistributedOptimizer's positional arguments bound differently from Horovod's")
    model(torch.ones(1, 2) * (rank + 1)).sum().backward()
    opt.step()
    report("API forms")


def main():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(0)
    for case in (case_launcher_environment, case_int16, case_scaling, case_grouped_reducescatter,
                 case_reducescatter_gradients, case_other_gradients,
                 case_broadcast_optimizer_state_without_grads, case_sparse_adam, case_api_forms):
        case(rank, size)
    hvd.shutdown()


if __name__ == "__main__":
    main()
