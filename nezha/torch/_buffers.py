"""Moving torch tensors to the engine and results back, with as few copies as each device allows.

The engine reads and writes C-contiguous host memory. A contiguous CPU tensor is handed over as a
numpy view of its own storage (no copy; `out=` makes the engine write results straight into the
destination tensor). A CUDA tensor is staged through pinned host memory: device->host copies are
enqueued on the tensor's current stream and that stream is synchronized once before the engine may
read; results go back with a non-blocking host->device copy on the current stream, so later work on
that stream is ordered after it. Pinned blocks come from torch's caching host allocator, which also
keeps a block alive until the asynchronous copy that reads it has finished.

bfloat16 has no numpy dtype. The engine takes ml_dtypes' bfloat16 arrays, so with ml_dtypes
installed a bf16 tensor is handed over as such a view of its storage (zero copy). Without it,
collectives that move data (allgather, broadcast, alltoall) carry the raw 16-bit storage, which is
exact, and reductions are done on a float32 copy and rounded back (see `REDUCES_BFLOAT16`).
"""

import numpy as np
import torch

import nezha
from nezha._buffers import BFLOAT16

# True when bf16 tensors can be reduced by the engine's own bf16 kernels.
REDUCES_BFLOAT16 = BFLOAT16 is not None

# The torch dtypes named like the engine's own DataType values (never listed by hand); numpy
# describes every one of them but bfloat16.
ENGINE_TYPES = frozenset(getattr(torch, name) for name in nezha.DataType.__members__)
NUMPY_TYPES = ENGINE_TYPES - {torch.bfloat16}


class UnsupportedTensorError(TypeError, ValueError):
    """A tensor the engine cannot carry. A TypeError, and a ValueError as Horovod raises for an
    unsupported tensor type, so either `except` catches it."""


def check_supported(tensor, what):
    """Raises UnsupportedTensorError naming the op and the dtype when the engine cannot carry
    `tensor`."""
    if not isinstance(tensor, torch.Tensor):
        raise UnsupportedTensorError("%s expects a torch.Tensor, got %s"
                                     % (what, type(tensor).__name__))
    if tensor.dtype not in ENGINE_TYPES:
        names = ", ".join(sorted(str(t).replace("torch.", "") for t in ENGINE_TYPES))
        raise UnsupportedTensorError("%s: dtype %s is not supported by Nezha (supported: %s)"
                                     % (what, str(tensor.dtype).replace("torch.", ""), names))
    if tensor.is_sparse:
        raise UnsupportedTensorError("%s: sparse tensors are not supported; pass "
                                     "tensor.to_dense()" % what)


class MixedDevicesError(RuntimeError, ValueError):
    """A group of tensors on different devices. A RuntimeError, as Horovod raises for it, and a
    ValueError, as for any other bad argument."""


def engine_device(tensor):
    """Horovod's CPU/GPU distinction for `tensor` (nezha.Device): anything but the CPU is a GPU.
    The ranks must agree, and a GPU's float16 is scaled in half precision (nezha.ops)."""
    return nezha.Device.cpu if tensor.device.type == "cpu" else nezha.Device.gpu


def group_device(tensors, what):
    """The one device of a group's tensors; raises MixedDevicesError when they differ, before
    anything is submitted (Horovod: "Tensors in list must be on same device")."""
    if len({engine_device(t) for t in tensors}) > 1:
        raise MixedDevicesError("%s: tensors in one group must be on the same kind of device "
                                "(CPU or GPU); got %s"
                                % (what, ", ".join(sorted({str(t.device) for t in tensors}))))
    return engine_device(tensors[0]) if tensors else nezha.Device.cpu


def engine_array(host):
    """A C-contiguous CPU tensor as a numpy view the engine reads/writes in place (shared memory).

    bfloat16 becomes an ml_dtypes view when available, else its 16-bit storage labelled float16
    (a same-size type the engine accepts): valid only for ops that copy bits without arithmetic;
    callers widen bf16 reductions instead (see `widen_bfloat16`).
    """
    host = host.detach()
    if host.dtype in NUMPY_TYPES:
        return host.numpy()
    if BFLOAT16 is not None:
        return host.view(torch.int16).numpy().view(BFLOAT16)
    return host.view(torch.float16).numpy()


def needs_widening(tensors):
    """True when some tensor is bf16 and the engine cannot be told so (no ml_dtypes)."""
    return not REDUCES_BFLOAT16 and any(t.dtype == torch.bfloat16 for t in tensors)


def widen_bfloat16(tensors):
    """float32 copies of the bf16 tensors (others unchanged), for a reduction the engine then does
    in float32; rounding the result back to bf16 is deterministic, so ranks stay bit-identical."""
    return [t.detach().float() if t.dtype == torch.bfloat16 else t for t in tensors]


def tensor_from_engine(result, dtype):
    """Wraps a numpy array the engine returned as a CPU tensor of `dtype`, without copying."""
    if dtype in NUMPY_TYPES:
        return torch.from_numpy(result)
    # bfloat16 arrives as a 2-byte numpy dtype (ml_dtypes.bfloat16 or raw uint16): same bits.
    if result.dtype.itemsize != torch.tensor([], dtype=dtype).element_size():
        raise TypeError("engine returned %s for a %s tensor" % (result.dtype, dtype))
    return torch.from_numpy(result.view(np.int16)).view(dtype)


def _is_engine_ready(tensor):
    return tensor.device.type == "cpu" and tensor.is_contiguous()


def is_numpy_view_ready(tensor):
    """A contiguous CPU tensor of a numpy dtype, which the engine treats as the CPU's
    (engine_device): `tensor.detach().numpy()` is its own storage, which the engine reads and writes
    in place (no staging, nothing to deliver)."""
    return (_is_engine_ready(tensor) and tensor.dtype in NUMPY_TYPES
            and engine_device(tensor) is nezha.Device.cpu)


def stage_in(tensors):
    """Host copies of `tensors` the engine may read (the tensors themselves where possible).

    All device->host copies are enqueued before any stream is synchronized, so a grouped op pays
    for one synchronization per stream, not one per tensor.
    """
    hosts, streams = [], {}
    for t in tensors:
        t = t.detach()
        if _is_engine_ready(t):
            hosts.append(t)
        elif t.device.type == "cpu":
            hosts.append(t.contiguous())
        elif t.device.type == "cuda":
            pinned = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            pinned.copy_(t, non_blocking=True)
            stream = torch.cuda.current_stream(t.device)
            streams[stream.cuda_stream] = stream
            hosts.append(pinned)
        else:  # other accelerators: a plain blocking copy
            hosts.append(t.to("cpu").contiguous())
    for stream in streams.values():
        stream.synchronize()
    return hosts


def host_output(like):
    """Where the engine should write a result shaped like `like`: `like`'s own memory when it is a
    contiguous CPU tensor, else a fresh (pinned for CUDA) host buffer that `copy_out` delivers."""
    like = like.detach()
    if _is_engine_ready(like):
        return like
    return torch.empty(like.shape, dtype=like.dtype,
                       pin_memory=(like.device.type == "cuda"))


def copy_out(host, target):
    """Delivers a host result into `target` (no-op when the engine already wrote there)."""
    target = target.detach()
    if host.data_ptr() == target.data_ptr() and host.device == target.device:
        return target
    target.copy_(host, non_blocking=(target.device.type == "cuda"))
    return target


def to_device_of(host, like):
    """A host result as a tensor on `like`'s device (the host tensor itself for CPU)."""
    if like.device.type == "cpu":
        return host
    return host.to(like.device, non_blocking=(like.device.type == "cuda"))
