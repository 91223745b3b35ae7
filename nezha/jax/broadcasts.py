"""Making replicas identical: parameter and optimizer-state pytrees, and picklable objects."""
from __future__ import annotations

from typing import Any, Optional

from .. import objects
from ..process_sets import global_process_set
from . import collectives


def broadcast_parameters(params: Any, root_rank: int = 0, name: Optional[str] = None,
                         process_set: Any = global_process_set) -> Any:
    """Returns ``root_rank``'s parameter pytree (flax variables, any pytree of arrays) on every
    rank (of ``process_set``): call it once after initialising so every replica starts identical."""
    return collectives.broadcast(params, root_rank, name=name or "broadcast_parameters",
                                 process_set=process_set)


def broadcast_optimizer_state(opt_state: Any, root_rank: int = 0,
                              process_set: Any = global_process_set) -> Any:
    """Returns ``root_rank``'s optax state on every rank (arrays broadcast; the rest as is)."""
    return collectives.broadcast(opt_state, root_rank, name="broadcast_optimizer_state",
                                 process_set=process_set)


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None) -> Any:
    """Returns ``root_rank``'s picklable ``obj`` on every rank (jax arrays pickle as themselves)."""
    return objects.broadcast_object(obj, root_rank, name)


def allgather_object(obj: Any, name: Optional[str] = None) -> list:
    """Returns the list of every rank's picklable ``obj``, in rank order."""
    return objects.allgather_object(obj, name)
