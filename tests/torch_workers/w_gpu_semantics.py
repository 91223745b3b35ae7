"""Horovod's semantics for CUDA tensors (issue 39), checked on the CPU: tensors are flagged as a
GPU's through nezha.torch's one device decision (`_buffers.engine_device`), so the engine treats
them as Horovod treats CUDA tensors while the data stays on the host. References are computed
with plain torch the way Horovod's GPU kernels and test_torch.py compute them.
"""

import time

import numpy as np
import torch

import nezha
import nezha.torch as hvd
from common import fail, report
from nezha.torch import _buffers

_flagged = {}   # id -> the tensor this process pretends is a GPU's (kept alive: ids stay unique)
_cpu_device = _buffers.engine_device
_buffers.engine_device = lambda t: nezha.Device.gpu if id(t) in _flagged else _cpu_device(t)


def on_gpu(tensor):
    _flagged[id(tensor)] = tensor
    return tensor


def same_bits(actual, expected, what):
    if actual.dtype != expected.dtype or actual.shape != expected.shape or \
            not torch.equal(actual.view(torch.int16), expected.view(torch.int16)):
        fail("%s:\n got      %s\n expected %s" % (what, actual, expected))


def half_as_on_gpu(x, factor):
    """Horovod's GPU scaling of a float16 tensor: the factor rounded to half (through float, as
    __float2half((float)f)), then a half multiply (torch rounds each product to half)."""
    return x * torch.tensor(factor, dtype=torch.float64).float().half()


def half_as_on_cpu(x, factor):
    """Horovod's CPU scaling of float16: in float32, rounded to half once."""
    return (x.float() * torch.tensor(factor, dtype=torch.float64).float()).half()


def differ(a, b):
    return not torch.equal(a.view(torch.int16), b.view(torch.int16))


def case_float16_scaling(rank, size):
    np.random.seed(1234)
    discriminating = 0
    # The last is over NEZHA_CONTROL_INLINE_BYTES: reduced on the rails, not by rank 0 inline.
    for dims in ([17], [17, 17], [size * 4, 5], [size * 64, 100]):
        torch.manual_seed(1234)
        factor = float(np.random.uniform())
        x = torch.FloatTensor(*dims).random_(-100, 100).half()
        n_half = torch.tensor(float(size)).half()
        # test_horovod_allreduce_prescale / postscale's CUDA references.
        pre = half_as_on_gpu(x, factor) * n_half
        same_bits(hvd.allreduce(on_gpu(x.clone()), op=hvd.Sum, prescale_factor=factor), pre,
                  "allreduce prescale %s" % dims)
        post = half_as_on_gpu(x * n_half, factor)
        same_bits(hvd.allreduce(on_gpu(x.clone()), op=hvd.Sum, postscale_factor=factor), post,
                  "allreduce postscale %s" % dims)
        # Average folds 1/size into the postscale before rounding it to half.
        avg = half_as_on_gpu(x * n_half, (1.0 / size))
        same_bits(hvd.allreduce(on_gpu(x.clone())), avg, "allreduce average %s" % dims)
        same_bits(hvd.grouped_allreduce([on_gpu(x.clone()), on_gpu(x.clone())], op=hvd.Sum,
                                        prescale_factor=factor)[1], pre,
                  "grouped_allreduce prescale %s" % dims)
        rows = x.shape[0] // size
        if x.shape[0] % size == 0:
            mine = slice(rank * rows, (rank + 1) * rows)
            same_bits(hvd.reducescatter(on_gpu(x.clone()), op=hvd.Sum, prescale_factor=factor),
                      pre[mine], "reducescatter prescale %s" % dims)
            same_bits(hvd.reducescatter(on_gpu(x.clone()), op=hvd.Sum, postscale_factor=factor),
                      post[mine], "reducescatter postscale %s" % dims)
            same_bits(hvd.grouped_reducescatter([on_gpu(x.clone())], op=hvd.Sum,
                                                postscale_factor=factor)[0], post[mine],
                      "grouped_reducescatter postscale %s" % dims)
        # The CPU's float32 arithmetic stays for CPU tensors.
        same_bits(hvd.allreduce(x.clone(), op=hvd.Sum, postscale_factor=factor),
                  half_as_on_cpu(x * n_half, factor), "CPU allreduce postscale %s" % dims)
        discriminating += differ(post, half_as_on_cpu(x * n_half, factor))
    if not discriminating:
        fail("no case where the GPU's and the CPU's rounding differ: the checks prove nothing")
    report("float16 scaled as on a GPU")


def expect_error_everywhere(fn, *fragments):
    start = time.monotonic()
    try:
        fn()
    except RuntimeError as exc:  # Horovod's tests accept RuntimeError (NezhaError is one)
        for f in fragments:
            if f not in str(exc):
                fail("%r not in %r" % (f, str(exc)))
        if time.monotonic() - start > 5:
            fail("the error took %.1f s" % (time.monotonic() - start))
        return
    fail("no error for %s" % (fragments,))


def case_cpu_gpu_mismatch(rank, size):
    def flagged_on_rank_0(t):
        return on_gpu(t) if rank == 0 else t
    # test_horovod_allreduce_cpu_gpu_error: every rank raises, naming the tensor and the ranks.
    expect_error_everywhere(lambda: hvd.allreduce(flagged_on_rank_0(torch.ones(17, 17)),
                                                  name="cpu_gpu"),
                            "cpu_gpu", "device (CPU/GPU)", "GPU on rank 0", "CPU on rank")
    expect_error_everywhere(lambda: hvd.allgather(flagged_on_rank_0(torch.ones(2, 3)),
                                                  name="cpu_gpu_ag"), "cpu_gpu_ag", "device")
    expect_error_everywhere(lambda: hvd.broadcast(flagged_on_rank_0(torch.ones(3)), 0,
                                                  name="cpu_gpu_bc"), "cpu_gpu_bc", "device")
    # test_horovod_grouped_allreduce_cpu_gpu_error: a group mixing devices, refused locally.
    mixed = [on_gpu(torch.ones(10)) if i % 2 else torch.ones(10) for i in range(5)]
    try:
        hvd.grouped_allreduce(mixed, op=hvd.Sum, name="mixed")
        fail("a group of CPU and GPU tensors was accepted")
    except RuntimeError as exc:
        if not isinstance(exc, _buffers.MixedDevicesError):
            fail("mixed group: %r" % exc)
    # Nothing of the refused group is in flight, and the engine goes on.
    out = hvd.grouped_allreduce([torch.ones(10)] * 5, op=hvd.Sum, name="mixed")
    if any(not torch.equal(o, torch.full((10,), float(size))) for o in out):
        fail("grouped allreduce after the refusal: %s" % out)
    report("CPU/GPU mismatch raises on every rank")


def case_alltoall_splits_device(rank, size):
    # Horovod returns received_splits on the device of the splits tensor (`splits.new()`); here
    # the CPU cases end to end, the routing for other devices through torch's meta device.
    splits = torch.tensor([rank + 1] * size, dtype=torch.int32)
    rows = torch.arange(size * (rank + 1), dtype=torch.float32)
    _, received = hvd.alltoall(rows, splits)
    if received.device.type != "cpu" or received.tolist() != [r + 1 for r in range(size)]:
        fail("received_splits %s" % received)
    meta = torch.empty(size, dtype=torch.int32, device="meta")
    got = hvd.mpi_ops.received_splits_like(np.arange(size), meta)
    if got.device.type != "meta" or got.dtype != torch.int32:
        fail("received_splits for splits on %s: %s %s" % (meta.device, got.device, got.dtype))
    if hvd.mpi_ops.received_splits_like(np.arange(size), [1] * size).device.type != "cpu":
        fail("received_splits for a list of splits is not on the CPU")
    report("alltoall received_splits on the splits' device")


def case_parameter_names(rank, size):
    # test_optimizer_no_named_parameters.
    model = torch.nn.Sequential(torch.nn.Linear(10, 10), torch.nn.Linear(10, 10))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(
        [{"params": model[0].parameters()}, {"params": model[1].parameters()}], lr=0.001))
    names = opt._parameter_names
    expected = {p: "allreduce.noname.%d.%d" % (g, i)
                for g, group in enumerate([model[0].parameters(), model[1].parameters()])
                for i, p in enumerate(group)}
    if names != expected:
        fail("_parameter_names %s, expected Horovod's %s" % (sorted(names.values()),
                                                            sorted(expected.values())))
    everyone = hvd.allgather_object(sorted(names.values()))
    if any(n != everyone[0] for n in everyone):
        fail("parameter names differ across ranks: %s" % everyone)
    report("_parameter_names")


hvd.init()
for case in (case_float16_scaling, case_cpu_gpu_mismatch, case_alltoall_splits_device,
             case_parameter_names):
    case(hvd.rank(), hvd.size())
hvd.shutdown()
