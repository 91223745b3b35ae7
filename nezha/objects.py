"""Collectives on picklable Python objects: `broadcast_object` and `allgather_object`.

An object travels as its pickled bytes in a uint8 array, preceded by its length; peers are
authenticated by the engine, so unpickling what they send is as safe as the job itself. An adapter
whose objects hold its tensors passes its own `dumps`/`loads` (nezha.torch: torch.save/torch.load,
which keep storage sharing and devices).
"""
from __future__ import annotations

import pickle
from typing import Any, Callable, List, Optional

import numpy as np

from . import ops
from .basics import rank
from .process_sets import global_process_set

Dumps = Callable[[Any], bytes]
Loads = Callable[[bytes], Any]


def _pickle_dumps(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None,
                     process_set: Any = global_process_set, *, dumps: Dumps = _pickle_dumps,
                     loads: Loads = pickle.loads) -> Any:
    """Returns root_rank's `obj` on every rank (of the process set; the others' `obj` is
    ignored)."""
    # Named like the adapters' broadcasts of the same name ("broadcast.<name>.<part>").
    base = "broadcast.%s" % ("broadcast_object" if name is None else name)
    is_root = rank() == root_rank
    payload = np.frombuffer(dumps(obj), np.uint8) if is_root else None
    length = np.array([payload.size if is_root else 0], np.int64)
    length = ops.broadcast(length, root_rank, name=base + ".length", process_set=process_set)
    data = ops.broadcast(payload if is_root else np.empty(int(length[0]), np.uint8), root_rank,
                         name=base + ".data", process_set=process_set)
    return loads(data.tobytes())


def allgather_object(obj: Any, name: Optional[str] = None, process_set: Any = global_process_set,
                     *, dumps: Dumps = _pickle_dumps, loads: Loads = pickle.loads) -> List[Any]:
    """Returns the list of every rank's `obj` (of the process set), in rank order."""
    base = "allgather.%s" % ("allgather_object" if name is None else name)
    payload = np.frombuffer(dumps(obj), np.uint8)
    lengths = ops.allgather(np.array([payload.size], np.int64), name=base + ".length",
                            process_set=process_set)
    data = ops.allgather(payload, name=base + ".data", process_set=process_set)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return [loads(data[offsets[r]:offsets[r + 1]].tobytes()) for r in range(len(lengths))]
