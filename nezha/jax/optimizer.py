"""optax: a distributed optimizer (flax users pass their optax transformation)."""
from __future__ import annotations

from typing import Any, Optional

try:
    import optax
except ImportError as error:  # collectives and pmap work without optax
    raise ImportError("nezha.jax's optimizer needs optax: pip install 'nezha[jax]'") from error

from .. import process_sets
from . import collectives


def allreduce_gradients(op: Any = collectives.Average, compression: Any = None,
                        name: Optional[str] = None,
                        process_set: Any = process_sets.global_process_set) -> optax.GradientTransformation:
    """An optax transformation that allreduces the updates (gradients) across processes (of
    ``process_set``), as one grouped submission per step so the engine fuses them. As in Horovod, on
    a rank outside the set (or for a set of one rank) the updates stay this rank's own."""
    reduces = process_sets.reduces_gradients_over(process_set)  # ValueError: not registered

    def update(updates, state, params=None):
        del params
        if not reduces:
            return updates, state
        return collectives.grouped_allreduce(updates, op=op, name=name, compression=compression,
                                             process_set=process_set), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def DistributedOptimizer(tx: optax.GradientTransformation, backward_passes_per_step: int = 1,
                         op: Any = collectives.Average, compression: Any = None,
                         name: Optional[str] = None,
                         process_set: Any = process_sets.global_process_set) -> optax.GradientTransformation:
    """Wraps ``tx`` so that gradients are averaged (``op``) across processes (of ``process_set``)
    before it sees them.

    With ``backward_passes_per_step`` k > 1, gradients are accumulated locally (averaged over the
    k passes, as ``optax.MultiSteps``) and reduced across processes once every k steps, inside
    the same jit-compatible update. Works eagerly and inside ``jax.jit``.
    """
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be a positive int, got "
                         f"{backward_passes_per_step!r}")
    inner = optax.chain(allreduce_gradients(op, compression, name, process_set), tx)
    if backward_passes_per_step == 1:
        return inner
    return optax.MultiSteps(inner, every_k_schedule=backward_passes_per_step).gradient_transformation()
