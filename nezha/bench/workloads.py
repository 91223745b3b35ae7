"""What each rank sends and what it must get back, for a cheap correctness check of every size.

Inputs are small integers laid out so that every reduction is exact in every dtype (no rounding,
no overflow) and every rank's contribution differs, so a misplaced or missing block shows up.
"""
from __future__ import annotations

from typing import List

import numpy as np

DTYPES = ("uint8", "int8", "int32", "int64", "float16", "bfloat16", "float32", "float64", "bool")
_MAX_PERIOD = 16
# Largest integer each float dtype represents exactly (2^(mantissa bits + 1)).
_EXACT_FLOAT_LIMIT = {"float16": 2 ** 11, "bfloat16": 2 ** 8, "float32": 2 ** 24, "float64": 2 ** 53}


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype for a nezha dtype name; bfloat16 comes from ml_dtypes."""
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; expected one of {', '.join(DTYPES)}")
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError as exc:
            raise ValueError("dtype bfloat16 needs the ml_dtypes package (pip install ml_dtypes)") from exc
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def element_count(op: str, num_bytes: int, itemsize: int, world: int) -> int:
    """Elements per rank for a size in bytes. Ops that split the buffer between ranks
    (alltoall, reducescatter) get a multiple of the world size so every rank's block is equal,
    which keeps the Gloo baseline (equal blocks only) measuring the same thing."""
    count = max(1, num_bytes // itemsize)
    if op in ("alltoall", "reducescatter"):
        count = max(world, count - count % world)
    return count


def split_counts(count: int, world: int) -> List[int]:
    """Block sizes when `count` rows are split over `world` ranks: as even as possible, the lower
    ranks get the extra rows (the nezha.reducescatter convention)."""
    base, extra = divmod(count, world)
    return [base + (1 if r < extra else 0) for r in range(world)]


def _period(dtype_name: str, world: int) -> int:
    """Values cycle through 0..period-1 so a sum over `world` ranks stays exactly representable."""
    if dtype_name in _EXACT_FLOAT_LIMIT:
        limit = _EXACT_FLOAT_LIMIT[dtype_name]
    else:
        limit = int(np.iinfo(np.dtype(dtype_name)).max)
    return max(1, min(_MAX_PERIOD, limit // world + 1))


def _pattern_period(dtype_name: str, world: int) -> int:
    return world + 1 if dtype_name == "bool" else _period(dtype_name, world)


def _rank_pattern(rank: int, world: int, dtype_name: str) -> np.ndarray:
    """One period of rank `rank`'s input, as int64."""
    period = _pattern_period(dtype_name, world)
    index = np.arange(period, dtype=np.int64)
    if dtype_name == "bool":
        # At most one rank holds True at each index, so a sum is a plain 0/1 whatever the engine
        # does on bool overflow.
        return ((index + rank) % period == 0).astype(np.int64)
    return (index + rank) % period


def _as_dtype(values: np.ndarray, dtype_name: str) -> np.ndarray:
    return values.astype(bool) if dtype_name == "bool" else values.astype(numpy_dtype(dtype_name))


def rank_input(rank: int, world: int, count: int, dtype_name: str) -> np.ndarray:
    """The buffer rank `rank` contributes: a short pattern repeated (cheap even for 64 MB)."""
    return np.resize(_as_dtype(_rank_pattern(rank, world, dtype_name), dtype_name), count)


def _reduced_sum(world: int, count: int, dtype_name: str) -> np.ndarray:
    # Every rank's pattern has the same period, so the sum is the sum of one period, repeated.
    period_sum = sum(_rank_pattern(rank, world, dtype_name) for rank in range(world))
    return np.resize(_as_dtype(period_sum, dtype_name), count)


def expected_output(op: str, rank: int, world: int, count: int, dtype_name: str,
                    root: int = 0) -> np.ndarray:
    """What rank `rank` must receive from `op` (reductions are sums; broadcast from `root`)."""
    if op == "allreduce":
        return _reduced_sum(world, count, dtype_name)
    if op == "reducescatter":
        blocks = np.cumsum([0] + split_counts(count, world))
        return _reduced_sum(world, count, dtype_name)[blocks[rank]:blocks[rank + 1]]
    if op == "allgather":
        return np.concatenate([rank_input(r, world, count, dtype_name) for r in range(world)])
    if op == "broadcast":
        return rank_input(root, world, count, dtype_name)
    if op == "alltoall":
        blocks = np.cumsum([0] + split_counts(count, world))
        return np.concatenate([rank_input(src, world, count, dtype_name)[blocks[rank]:blocks[rank + 1]]
                               for src in range(world)])
    raise ValueError(f"unknown op {op!r}")


class VerificationError(RuntimeError):
    """A collective returned something other than the reference result."""


def verify(label: str, got: np.ndarray, expected: np.ndarray) -> None:
    """Raises VerificationError naming `label`, the mismatch count and the first bad index."""
    got = np.asarray(got).reshape(-1)
    if got.shape != expected.shape:
        raise VerificationError(f"{label}: got {got.shape[0]} elements, expected {expected.shape[0]}")
    if got.dtype != expected.dtype:
        raise VerificationError(f"{label}: got dtype {got.dtype}, expected {expected.dtype}")
    # Every reference value is a small integer, exact in its dtype: compare without tolerance.
    bad = np.flatnonzero(got != expected)
    if bad.size:
        first = int(bad[0])
        raise VerificationError(
            f"{label}: {bad.size} of {expected.size} elements differ from the reference "
            f"(first at index {first}: got {got[first]!r}, expected {expected[first]!r})")
