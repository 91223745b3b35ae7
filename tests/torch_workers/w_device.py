"""The ops and DistributedOptimizer with tensors on one device (`cpu` or `cuda`), against CPU references.

Usage: w_device.py DEVICE. On CUDA this checks the staging through pinned host memory: results land
on the tensor's device, the engine reads what kernels queued just before the op wrote (the stream is
synchronized first), and later kernels on the stream see the results. On CPU the same checks cover
the zero-copy views and the non-contiguous path, so the worker itself is exercised on every machine.
"""

import copy
import sys

import torch

import nezha.torch as hvd
from common import assert_close, assert_identical_on_all_ranks, fail, report
from w_ops import check, make, reference_reduce
from w_optimizer import batch, fresh_model, loss_fn, reference_grads

STREAM_ELEMENTS = 1 << 22  # 16 MB of float32: long enough for queued kernels to still be running


def on(t, device):
    return t.to(device, copy=True)  # a copy on CPU too: the op must not touch the reference inputs


def expect_on(t, device, what):
    if t.device.type != device.type:
        fail("%s: result on %s, expected %s" % (what, t.device, device))


def check_ops(rank, size, device):
    inputs = [make(r, (5, 4), torch.float32, 80) for r in range(size)]
    x = on(inputs[rank], device)
    for op in (hvd.Sum, hvd.Average, hvd.Max):
        got = hvd.allreduce(x, op=op, name="device.allreduce.%s" % op)
        expect_on(got, device, "allreduce")
        check(got, reference_reduce(inputs, op, torch.float32), "allreduce on %s" % device)
    assert_close(x, inputs[rank], "allreduce must not modify its input")

    view = on(inputs[rank], device).t()  # non-contiguous
    hvd.allreduce_(view, op=hvd.Sum, name="device.noncontiguous")
    expect_on(view, device, "allreduce_ non-contiguous")
    check(view, reference_reduce([i.t() for i in inputs], hvd.Sum, torch.float32), "non-contiguous allreduce_")

    y = on(inputs[rank], device)
    handle = hvd.allreduce_async_(y, op=hvd.Sum, name="device.async")
    if hvd.synchronize(handle) is not y:
        fail("allreduce_async_ did not return its own tensor")
    check(y, reference_reduce(inputs, hvd.Sum, torch.float32), "allreduce_async_ on %s" % device)

    group = [[make(r, s, torch.float32, 81 + j) for r in range(size)] for j, s in enumerate([(3,), (2, 2)])]
    mine = [on(g[rank], device) for g in group]
    hvd.grouped_allreduce_(mine, op=hvd.Sum, name="device.grouped")
    for got, g in zip(mine, group):
        expect_on(got, device, "grouped_allreduce_")
        check(got, reference_reduce(g, hvd.Sum, torch.float32), "grouped_allreduce_ on %s" % device)
    report("allreduce on %s" % device.type)

    rows = [make(r, (r + 1, 3), torch.float32, 82) for r in range(size)]
    got = hvd.allgather(on(rows[rank], device), name="device.allgather")
    expect_on(got, device, "allgather")
    check(got, torch.cat(rows), "allgather on %s" % device)

    b = on(inputs[rank], device)
    hvd.broadcast_(b, size - 1, name="device.broadcast")
    check(b, inputs[size - 1], "broadcast_ on %s" % device)

    even = [make(r, (2 * size, 3), torch.float32, 83) for r in range(size)]
    got = hvd.alltoall(on(even[rank], device), name="device.alltoall")
    expect_on(got, device, "alltoall")
    check(got, torch.cat([e[2 * rank:2 * rank + 2] for e in even]), "alltoall on %s" % device)

    tall = [make(r, (2 * size, 3), torch.float32, 84) for r in range(size)]
    got = hvd.reducescatter(on(tall[rank], device), op=hvd.Sum, name="device.reducescatter")
    expect_on(got, device, "reducescatter")
    check(got, reference_reduce(tall, hvd.Sum, torch.float32)[2 * rank:2 * rank + 2],
          "reducescatter on %s" % device)

    # Grouped: negotiated as one unit, fused into one operation on the rails, staged together.
    parts = [[make(r, (r + 1 + j, 2), torch.float32, 85 + j) for r in range(size)] for j in range(2)]
    got = hvd.grouped_allgather([on(p[rank], device) for p in parts], name="device.grouped_allgather")
    for j, (t, p) in enumerate(zip(got, parts)):
        expect_on(t, device, "grouped_allgather")
        check(t, torch.cat(p), "grouped_allgather %d on %s" % (j, device))
    blocks = [[make(r, (2 * size + j, 3), torch.float32, 87 + j) for r in range(size)] for j in range(2)]
    got = hvd.grouped_reducescatter([on(b[rank], device) for b in blocks], op=hvd.Sum,
                                    name="device.grouped_reducescatter")
    for j, (t, b) in enumerate(zip(got, blocks)):
        rows = 2 * size + j
        counts = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
        start = sum(counts[:rank])
        expect_on(t, device, "grouped_reducescatter")
        check(t, reference_reduce(b, hvd.Sum, torch.float32)[start:start + counts[rank]],
              "grouped_reducescatter %d on %s" % (j, device))
    report("other ops on %s" % device.type)


def check_stream_order(rank, size, device):
    """Kernels queued just before an op are waited for; kernels queued after it see its result."""
    x = torch.zeros(STREAM_ELEMENTS, device=device)
    for _ in range(20):
        x.add_(rank + 1)  # asynchronous on CUDA: still queued when the op is called
    got = hvd.allreduce(x, op=hvd.Sum, name="device.stream.out")
    doubled = got * 2  # queued on the same stream after the result's copy back
    total = 20 * size * (size + 1) // 2
    check(doubled[:1000].cpu(), torch.full((1000,), 2.0 * total), "kernels after the op on %s" % device)
    check(got[-1000:].cpu(), torch.full((1000,), float(total)), "kernels before the op on %s" % device)
    for _ in range(20):
        x.add_(1)
    hvd.allreduce_(x, op=hvd.Sum, name="device.stream.inplace")
    check(x[-1000:].cpu(), torch.full((1000,), float(total + 20 * size)), "allreduce_ after kernels on %s" % device)
    report("stream order on %s" % device.type)


def check_training(rank, size, device, steps=3):
    """A model on the device trains like plain torch on CPU over the concatenated batch."""
    model = fresh_model()
    reference = copy.deepcopy(model)
    model.to(device)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters())
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        opt.zero_grad()
        x, y = batch(rank, step)
        loss_fn(model, x.to(device), y.to(device)).backward()
        opt.step()
        expected = reference_grads(reference, step, size)
        for name, p in model.named_parameters():
            if name in expected:
                expect_on(p.grad, device, "gradient %s" % name)
                assert_close(p.grad, expected[name], "step %d grad %s on %s" % (step, name, device),
                             rtol=1e-5, atol=1e-6)
        ref_opt.step()
        assert_identical_on_all_ranks(list(model.parameters()), "device.params.%d" % step)
    report("DistributedOptimizer on %s" % device.type)


def check_horovod_cuda_semantics(rank, size, device):
    """Horovod's GPU semantics with real CUDA tensors: float16 scaled in half precision (the reference is torch's
    CUDA half multiply, as in Horovod's test_torch.py), a CPU tensor on some ranks against CUDA
    tensors on others raises on every rank, alltoall's received splits on the splits' device."""
    torch.manual_seed(1234)
    x = torch.FloatTensor(17, 17).random_(-100, 100).to(device).half()
    factor = 0.6180339887
    f = torch.tensor(factor, dtype=torch.float64).float().to(device).half()
    for got, expected, what in (
            (hvd.allreduce(x, op=hvd.Sum, prescale_factor=factor, name="device.pre"),
             (f * x) * size, "prescale"),
            (hvd.allreduce(x, op=hvd.Sum, postscale_factor=factor, name="device.post"),
             (x * size) * f, "postscale")):
        expect_on(got, device, what)
        if not torch.equal(got.view(torch.int16).cpu(), expected.view(torch.int16).cpu()):
            fail("float16 %s on %s:\n got      %s\n expected %s" % (what, device, got, expected))
    mixed = torch.ones(17, device=device) if rank % 2 == 0 else torch.ones(17)
    try:
        hvd.allreduce(mixed, name="device.cpu_gpu")
        fail("a CPU tensor against CUDA tensors was reduced")
    except RuntimeError as exc:
        if "device (CPU/GPU)" not in str(exc):
            fail("CPU/GPU mismatch: %s" % exc)
    splits = torch.tensor([rank + 1] * size, dtype=torch.int32, device=device)
    _, received = hvd.alltoall(torch.full((size * (rank + 1),), float(rank)), splits)
    expect_on(received, device, "received_splits")
    if received.tolist() != [r + 1 for r in range(size)]:
        fail("received_splits %s" % received)
    report("Horovod's CUDA semantics on %s" % device.type)


def main():
    device = torch.device(sys.argv[1])
    hvd.init()
    if device.type == "cuda":
        if not torch.cuda.is_available():
            fail("no CUDA device")
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    rank, size = hvd.rank(), hvd.size()
    check_ops(rank, size, device)
    check_stream_order(rank, size, device)
    check_training(rank, size, device)
    if device.type == "cuda":
        check_horovod_cuda_semantics(rank, size, device)
    hvd.shutdown()


if __name__ == "__main__":
    main()
