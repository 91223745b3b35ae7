"""Gradient-reduction bookkeeping every adapter's distributed optimizer shares.

Which gradients are reduced together (buckets), under which name, when a bucket is ready
(`backward_passes_per_step` local passes per step), how the average is split around the sum
(`gradient_predivide_factor`), and which buckets are still in flight. No framework: parameters are
opaque hashable keys chosen by the adapter (torch: the parameters themselves), and the adapter
passes two callables, `submit` (start reducing a bucket's gradients, return a Handle) and
`finish` (put a bucket's results back into its gradients).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Hashable, Iterable, List, Optional, Sequence, Tuple

from . import objects
from .handle import Handle
from .ops import Average, ReduceOp

Key = Hashable
Bucket = Tuple[Key, ...]
# submit(bucket, name, op, prescale_factor, postscale_factor) -> Handle of the bucket's reduction
Submit = Callable[[Bucket, str, ReduceOp, float, float], Handle]
# finish(bucket, result of that Handle)
Finish = Callable[[Bucket, Any], None]


def name_parameters(param_groups: Sequence[Sequence[Key]],
                    named_parameters: Optional[Iterable[Tuple[str, Key]]]) -> Dict[Key, str]:
    """Parameter -> the name its gradient is reduced under: from `named_parameters`, else generated
    from its position in `param_groups` (the same on every rank). Checks Horovod's rules: pairs,
    unique names, every parameter named."""
    if named_parameters is not None:
        named_parameters = list(named_parameters)
    else:
        named_parameters = [("allreduce.noname.%d.%d" % (g, i), p)
                            for g, group in enumerate(param_groups)
                            for i, p in enumerate(group)]
    if any(not isinstance(item, tuple) or len(item) != 2 for item in named_parameters):
        raise ValueError("named_parameters should be a sequence of (name, parameter) tuples, "
                         "usually produced by model.named_parameters().")
    seen, dups = set(), set()
    for name, _ in named_parameters:
        (dups if name in seen else seen).add(name)
    if dups:
        raise ValueError("Parameter names in named_parameters must be unique; duplicates: %s"
                         % ", ".join(sorted(dups)))
    names = {p: name for name, p in named_parameters}
    unnamed = [p for group in param_groups for p in group if p not in names]
    if unnamed:
        raise ValueError("named_parameters was given, but %d optimizer parameter(s) are not in it "
                         "(shapes: %s)" % (len(unnamed), [tuple(getattr(p, "shape", ()))
                                                         for p in unnamed]))
    return names


def form_buckets(trainable: Sequence[Key], groups: Any, names: Dict[Key, str]) -> Dict[Key, Bucket]:
    """Parameter -> the tuple of parameters reduced together with it (a 1-tuple without groups).

    `groups` is Horovod's: None or 0 (one bucket per parameter), an int (that many buckets of
    consecutive parameters in rank 0's order of names), or a list of parameter lists (the rest
    alone). `trainable` must be sorted by name; buckets are too.
    """
    if groups is None or groups == 0:
        return {p: (p,) for p in trainable}
    if isinstance(groups, int):
        if groups < 0:
            raise ValueError("groups must be a non-negative int or a list of parameter lists")
        # Every rank must form identical groups: take rank 0's order of names.
        order = objects.broadcast_object([names[p] for p in trainable], root_rank=0,
                                         name="DistributedOptimizer.groups")
        by_name = {names[p]: p for p in trainable}
        ordered = [by_name[n] for n in order]
        per_group, extra = divmod(len(ordered), groups)
        bucket_of, start = {}, 0
        for g in range(groups):
            end = start + per_group + (1 if g < extra else 0)
            bucket = tuple(ordered[start:end])
            for p in bucket:
                bucket_of[p] = bucket
            start = end
        return bucket_of
    trainable_set = set(trainable)
    bucket_of = {}
    for group in groups:
        bucket = tuple(sorted((p for p in group if p in trainable_set), key=names.get))
        for p in bucket:
            if p in bucket_of:
                raise ValueError("parameter %r appears in two groups" % names[p])
            bucket_of[p] = bucket
    for p in trainable:
        bucket_of.setdefault(p, (p,))
    return bucket_of


def scale_factors(op: ReduceOp, gradient_predivide_factor: float) -> Tuple[float, float]:
    """(prescale, postscale) for reducing gradients: Horovod's split of the average, prescaled by
    1/factor and postscaled by factor (the engine folds 1/size into the postscale)."""
    if op == Average:
        return 1.0 / gradient_predivide_factor, gradient_predivide_factor
    return 1.0, 1.0


class GradientReducer:
    """The state of one distributed optimizer's gradient reduction between two steps.

    The adapter calls `ready(p)` each time a backward pass has produced p's gradient; after
    `backward_passes_per_step` such passes the gradient is final, and once every member of its
    bucket is final the bucket is submitted. `synchronize()` submits what was not (parameters
    unused on this rank: another rank may have used them, so every rank must submit), waits for
    every bucket and finishes it, ready for the next step.
    """

    def __init__(self, names: Dict[Key, str], trainable: Iterable[Key], groups: Any,
                 backward_passes_per_step: int, op: ReduceOp, gradient_predivide_factor: float,
                 submit: Submit, finish: Finish,
                 still_trainable: Callable[[Key], bool] = lambda p: True) -> None:
        if gradient_predivide_factor != 1.0 and op != Average:
            raise ValueError("gradient_predivide_factor is supported only with op == Average")
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be >= 1")
        self.names = names
        self.trainable = sorted(trainable, key=names.__getitem__)
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.backward_passes_per_step = backward_passes_per_step
        self._bucket_of = form_buckets(self.trainable, groups, names)
        self._submit, self._finish, self._still_trainable = submit, finish, still_trainable
        self._passes_left = {p: backward_passes_per_step for p in names}
        self._ready: Dict[Bucket, set] = {}      # bucket -> parameters final for this step
        self._handles: Dict[Bucket, Handle] = {}  # bucket -> its reduction in flight

    @property
    def in_flight(self) -> bool:
        """True between the first final gradient of a step and the end of `synchronize()`."""
        return bool(self._handles or self._ready)

    def ready(self, p: Key) -> None:
        """One backward pass produced `p`'s gradient."""
        if self._passes_left[p] <= 0:
            raise AssertionError(
                "Gradient of %r was computed more than backward_passes_per_step=%d times before "
                "step(). Increase backward_passes_per_step to accumulate gradients locally."
                % (self.names[p], self.backward_passes_per_step))
        self._passes_left[p] -= 1
        if self._passes_left[p] > 0:
            return
        bucket = self._bucket_of[p]
        ready = self._ready.setdefault(bucket, set())
        ready.add(p)
        if len(ready) == len(bucket):
            self._start(bucket)

    def synchronize(self) -> None:
        """Submits every bucket not yet submitted, then waits for each and finishes it."""
        for bucket in dict.fromkeys(self._bucket_of.values()):
            if bucket not in self._handles and any(self._still_trainable(p) for p in bucket):
                self._start(bucket)
        for bucket, handle in list(self._handles.items()):
            self._finish(bucket, handle.wait())
            for p in bucket:
                self._passes_left[p] = self.backward_passes_per_step
        self._handles.clear()
        self._ready.clear()

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Changes the number of passes per step; every count starts again."""
        self.backward_passes_per_step = passes
        for p in self._passes_left:
            self._passes_left[p] = passes

    def reset(self) -> None:
        """Forgets the step in progress (its reductions complete unobserved)."""
        self._handles.clear()
        self._ready.clear()
        self.set_backward_passes_per_step(self.backward_passes_per_step)

    def _start(self, bucket: Bucket) -> None:
        prescale, postscale = scale_factors(self.op, self.gradient_predivide_factor)
        self._handles[bucket] = self._submit(bucket, self.names[bucket[0]], self.op, prescale,
                                             postscale)


__all__ = ["GradientReducer", "name_parameters", "form_buckets", "scale_factors"]
