"""Message sizes on the command line: "8,1K,64K,1M,64M" (K/M/G are powers of 1024)."""
from __future__ import annotations

import re
from typing import List

_SUFFIX_POWER = {"": 0, "K": 1, "M": 2, "G": 3}
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([KMG]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Parses one size ("64K" -> 65536). Raises ValueError naming the bad text."""
    match = _SIZE_RE.match(text)
    if not match:
        raise ValueError(f"bad size {text!r}: expected a positive integer with optional K, M or G suffix")
    value = int(match.group(1)) * 1024 ** _SUFFIX_POWER[match.group(2).upper()]
    if value <= 0:
        raise ValueError(f"bad size {text!r}: must be positive")
    return value


def parse_sizes(text: str) -> List[int]:
    """Parses a comma list of sizes, keeping the given order; duplicates are rejected."""
    items = [item for item in text.split(",") if item.strip()]
    if not items:
        raise ValueError("no sizes given")
    sizes = [parse_size(item) for item in items]
    if len(set(sizes)) != len(sizes):
        raise ValueError(f"duplicate sizes in {text!r}")
    return sizes


def format_size(num_bytes: int) -> str:
    """The shortest exact form: 65536 -> "64K", 1000 -> "1000"."""
    for suffix in ("G", "M", "K"):
        unit = 1024 ** _SUFFIX_POWER[suffix]
        if num_bytes >= unit and num_bytes % unit == 0:
            return f"{num_bytes // unit}{suffix}"
    return str(num_bytes)
