"""optax and flax: a distributed optimizer and broadcasts of parameters and objects."""
from __future__ import annotations

from typing import Any, Optional

import optax

from .. import objects
from . import collectives


def allreduce_gradients(op: Any = collectives.Average, compression: Any = None,
                        name: Optional[str] = None) -> optax.GradientTransformation:
    """An optax transformation that allreduces the updates (gradients) across processes, as one
    grouped submission per step so the engine fuses them."""

    def update(updates, state, params=None):
        del params
        return collectives.grouped_allreduce(updates, op=op, name=name,
                                             compression=compression), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def DistributedOptimizer(tx: optax.GradientTransformation, backward_passes_per_step: int = 1,
                         op: Any = collectives.Average, compression: Any = None,
                         name: Optional[str] = None) -> optax.GradientTransformation:
    """Wraps ``tx`` so that gradients are averaged (``op``) across processes before it sees them.

    With ``backward_passes_per_step`` k > 1, gradients are accumulated locally (averaged over the
    k passes, as ``optax.MultiSteps``) and reduced across processes once every k steps, inside
    the same jit-compatible update. Works eagerly and inside ``jax.jit``.
    """
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be a positive int, got "
                         f"{backward_passes_per_step!r}")
    inner = optax.chain(allreduce_gradients(op, compression, name), tx)
    if backward_passes_per_step == 1:
        return inner
    return optax.MultiSteps(inner, every_k_schedule=backward_passes_per_step).gradient_transformation()


def broadcast_parameters(params: Any, root_rank: int = 0, name: Optional[str] = None) -> Any:
    """Returns ``root_rank``'s parameter pytree (flax variables, any pytree of arrays) on every
    rank: call it once after initialising so every replica starts identical."""
    return collectives.broadcast(params, root_rank, name=name or "broadcast_parameters")


def broadcast_optimizer_state(opt_state: Any, root_rank: int = 0) -> Any:
    """Returns ``root_rank``'s optax state on every rank (arrays broadcast; the rest as is)."""
    return collectives.broadcast(opt_state, root_rank, name="broadcast_optimizer_state")


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None) -> Any:
    """Returns ``root_rank``'s picklable ``obj`` on every rank (jax arrays pickle as themselves)."""
    return objects.broadcast_object(obj, root_rank, name)


def allgather_object(obj: Any, name: Optional[str] = None) -> list:
    """Returns the list of every rank's picklable ``obj``, in rank order."""
    return objects.allgather_object(obj, name)
