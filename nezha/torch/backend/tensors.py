"""Torch tensors as the engine carries them, for the "nezha" process group.

Reductions go through nezha.torch's staging (`mpi_ops`), on the tensor's own dtype; a complex
tensor is reduced as its real view (SUM, AVG and PREMUL_SUM act on real and imaginary parts
alike). Collectives that only move data (broadcast, allgather, alltoall, gather, scatter, send and
receive) carry every tensor as its bytes, so any dtype torch has travels (complex, float8, the
unsigned types), and a contiguous CPU tensor is read or written in place.
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

import torch
import torch.distributed as dist

import nezha
from nezha.torch import _buffers

RedOpType = dist.ReduceOp.RedOpType

_REDUCE_OPS = {RedOpType.SUM: nezha.Sum, RedOpType.AVG: nezha.Average, RedOpType.MIN: nezha.Min,
               RedOpType.MAX: nezha.Max, RedOpType.PRODUCT: nezha.Product}
# Reductions whose result on a complex tensor is the same op on its real and imaginary parts.
_COMPONENTWISE = (nezha.Sum, nezha.Average)


def reduction(op) -> Tuple[nezha.ReduceOp, float]:
    """torch's reduce op (a ReduceOp or its RedOpType) as nezha's op and a prescale factor."""
    kind = op.op if isinstance(op, dist.ReduceOp) else op
    if kind == RedOpType.PREMUL_SUM:
        factor = op.factor
        return nezha.Sum, float(factor.item() if isinstance(factor, torch.Tensor) else factor)
    try:
        return _REDUCE_OPS[kind], 1.0
    except KeyError:
        raise ValueError(f"the nezha backend does not support ReduceOp.{kind.name}; supported: "
                         "SUM, AVG, MIN, MAX, PRODUCT, PREMUL_SUM") from None


def reducible(tensor: torch.Tensor, op: nezha.ReduceOp, what: str) -> torch.Tensor:
    """The tensor the engine reduces for `tensor`: itself, or the real view of a complex one
    (sharing its memory). TypeError names a dtype the engine cannot reduce."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what} expects torch.Tensor, got {type(tensor).__name__}")
    if tensor.is_complex():
        if op not in _COMPONENTWISE:
            raise ValueError(f"{what}: {op.name} is not defined on complex tensors "
                             "(SUM, AVG and PREMUL_SUM are)")
        return torch.view_as_real(tensor)
    _buffers.check_supported(tensor, what)
    return tensor


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor`'s bytes as a 1-D uint8 tensor on its device: a view of its memory when it is
    contiguous (the engine then reads and writes it in place), else a copy."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected torch.Tensor, got {type(tensor).__name__}")
    if tensor.is_sparse:
        raise TypeError("the nezha backend does not carry sparse tensors; pass tensor.to_dense()")
    return tensor.detach().contiguous().view(-1).view(torch.uint8)


def byte_size(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def deliver(source: torch.Tensor, target: torch.Tensor) -> None:
    """Writes `source` (bytes, or a result of target's dtype or its real view) into `target`,
    unless it is target's own memory already."""
    target = target.detach()
    if target.numel() == 0 and source.numel() == 0:  # (an empty source's strides may be 0)
        return
    if source.dtype == torch.uint8 and target.dtype != torch.uint8:
        source = source.view(target.dtype)
    elif target.is_complex() and not source.is_complex():
        source = torch.view_as_complex(source.reshape(-1, 2).contiguous())
    if source.numel() != target.numel():
        raise ValueError(f"received {source.numel()} elements for a tensor of {target.numel()}")
    if source.data_ptr() == target.data_ptr() and source.device == target.device:
        return
    target.copy_(source.reshape(target.shape))


def deliver_bytes(blob: torch.Tensor, targets: Sequence[torch.Tensor], what: str) -> None:
    """Splits `blob` (1-D uint8) into consecutive pieces sized like `targets` and delivers each."""
    sizes = [byte_size(t) for t in targets]
    if sum(sizes) != blob.numel():
        raise ValueError(f"{what}: received {blob.numel()} bytes for outputs of {sum(sizes)} "
                         f"bytes ({len(targets)} tensors of {sizes[:8]}...)")
    offset = 0
    for size, target in zip(sizes, targets):
        deliver(blob[offset:offset + size], target)
        offset += size


def settle_devices(tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    """Waits for copies into CUDA outputs to land (they ran on this thread's stream) before the
    work is reported done, so any stream of the caller may read them. Returns `tensors`."""
    devices = {t.device for t in tensors if t.device.type == "cuda"}
    for device in devices:
        torch.cuda.current_stream(device).synchronize()
    return list(tensors)


def check_same(tensors: Sequence[torch.Tensor], like: torch.Tensor, what: str) -> None:
    """ValueError unless every tensor has `like`'s dtype and number of elements."""
    for i, t in enumerate(tensors):
        if t.dtype != like.dtype or t.numel() != like.numel():
            raise ValueError(f"{what}: tensor {i} is {t.dtype} with {t.numel()} elements; "
                             f"expected {like.dtype} with {like.numel()}")


def equal_splits(rows: int, parts: int, what: str) -> List[int]:
    if rows % parts:
        raise ValueError(f"{what}: dim 0 ({rows}) does not divide into {parts} equal parts; "
                         "pass split sizes")
    return [rows // parts] * parts


def row_bytes(tensor: torch.Tensor) -> int:
    """Bytes of one row (dim 0) of `tensor`."""
    rows = tensor.shape[0] if tensor.dim() else 1
    per_row = 1
    for d in tensor.shape[1:]:
        per_row *= d
    return (tensor.numel() // rows if rows else per_row) * tensor.element_size()
