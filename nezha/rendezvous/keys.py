"""Names of the store keys with a meaning shared by nezharun and the ranks."""

from __future__ import annotations

from typing import Optional

# A rank sets ARRIVED_PREFIX + str(rank) as soon as it has connected; nezharun's --start-timeout
# reports the ranks whose key never appeared.
ARRIVED_PREFIX = "nezha/arrived/"


def arrival_key(rank: int) -> str:
    """The key rank ``rank`` sets when it reaches the store."""
    return f"{ARRIVED_PREFIX}{int(rank)}"


def rank_from_arrival_key(key: str) -> Optional[int]:
    """The rank named by an arrival key, or None if ``key`` is not one."""
    if not key.startswith(ARRIVED_PREFIX):
        return None
    suffix = key[len(ARRIVED_PREFIX):]
    return int(suffix) if suffix.isdigit() else None
