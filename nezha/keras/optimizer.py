"""Horovod's `DistributedOptimizer` for Keras 3, on the TensorFlow, torch and JAX backends.

Keras calls `optimizer.apply()` in the train step on TensorFlow (inside tf.function) and torch,
and `stateless_apply()` (which runs `apply()`, except LossScaleOptimizer's own) inside jax.jit on
JAX. The wrapper is a subclass of the given optimizer's class (created on the fly, so the model
saves it as that class and `load_model` restores it) that reduces the gradients over every rank
before the optimizer sees them. Wrapping the outermost optimizer, a LossScaleOptimizer included,
means every rank checks the same reduced gradients for overflow and takes the same branch.

With `backward_passes_per_step` N > 1 the gradients of N steps are summed locally and reduced
and applied only every N-th step (averaged over the N steps when `average_aggregated_gradients`).
On JAX the step is one traced program, so the choice is made with `lax.cond` (the reduction runs
only on the N-th step, on every rank alike, since the counter is the same everywhere) and the
optimizer's update is kept or discarded with `where`, as Keras' own JAX gradient accumulation does.
"""
import keras

from nezha.compression import Compression
from nezha.gradients import scale_factors
from nezha.horovod_api import Average, resolve_op
from nezha.keras import _backend
from nezha.process_sets import global_process_set, member_of, reduces_gradients_over


class _DistributedOptimizer:
    """Mixin placed before the user's optimizer class; its state is set by DistributedOptimizer."""

    def _nezha_reduce(self, grads):
        if not self._nezha_reduces:  # outside its process set, or a set of one: as in Horovod
            return list(grads)
        prescale, postscale = scale_factors(self._nezha_op, self._nezha_predivide)
        return _backend.grouped_allreduce(list(grads), self._nezha_op, prescale, postscale,
                                          self._nezha_compression,
                                          process_set=self._nezha_process_set)

    @property
    def local_variables(self):
        """This rank's own state (the gradients accumulated between reductions), which a
        broadcast of the optimizer's variables must leave alone."""
        if self._nezha_passes == 1 or not self.built:
            return []
        return [self._nezha_count, *self._nezha_accumulators]

    def build(self, variables):
        super().build(variables)
        if self._nezha_passes > 1:
            self._nezha_count = self.add_variable((), initializer="zeros", dtype="int32",
                                                  name="nezha_backward_passes")
            self._nezha_accumulators = [self.add_variable_from_reference(v, "nezha_accumulated")
                                        for v in variables]

    def apply(self, grads, trainable_variables=None):
        if self._nezha_reduced_outside:  # stateless_apply reduced them already (JAX)
            return super().apply(grads, trainable_variables)
        if self._nezha_passes == 1:
            return super().apply(self._nezha_reduce(grads), trainable_variables)
        if keras.backend.backend() == "jax":
            return self._nezha_accumulate_traced(list(grads), trainable_variables)
        return self._nezha_accumulate(list(grads), trainable_variables)

    def stateless_apply(self, optimizer_variables, grads, trainable_variables):
        if self._nezha_passes > 1:
            if isinstance(self, keras.optimizers.LossScaleOptimizer):
                # Its stateless_apply never calls apply(): our accumulation would be bypassed.
                raise NotImplementedError(
                    "backward_passes_per_step > 1 around a LossScaleOptimizer on the JAX "
                    "backend; wrap the inner optimizer, or use backward_passes_per_step=1")
            # Keras runs apply() under a StatelessScope here: _nezha_accumulate_traced.
            return super().stateless_apply(optimizer_variables, grads, trainable_variables)
        grads = self._nezha_reduce(grads)
        self._nezha_reduced_outside = True
        try:
            return super().stateless_apply(optimizer_variables, grads, trainable_variables)
        finally:
            self._nezha_reduced_outside = False

    def _nezha_accumulate(self, grads, trainable_variables):
        ops = keras.ops
        if not self.built:
            variables = trainable_variables if trainable_variables is not None else []
            self.build(list(variables))
            self.built = True
        for acc, g in zip(self._nezha_accumulators, grads):
            if g is not None:
                acc.assign(acc + ops.cast(g, acc.dtype))
        count = self._nezha_count + 1
        passes = self._nezha_passes

        def reduce_and_apply():
            summed = [None if g is None else (acc / passes if self._nezha_average_aggregated
                                              else acc.value)
                      for acc, g in zip(self._nezha_accumulators, grads)]
            super(_DistributedOptimizer, self).apply(self._nezha_reduce(summed),
                                                     trainable_variables)
            for acc in self._nezha_accumulators:
                acc.assign(ops.zeros_like(acc))
            self._nezha_count.assign(0)

        def keep_accumulating():
            self._nezha_count.assign(count)

        ops.cond(count >= passes, reduce_and_apply, keep_accumulating)

    def _nezha_accumulate_traced(self, grads, trainable_variables):
        """JAX: no variable may be assigned inside a traced branch, so the reduction alone is
        conditional and every assignment selects between the old and the new value."""
        import jax
        import jax.numpy as jnp

        variables = list(trainable_variables if trainable_variables is not None
                         else self._trainable_variables)
        passes = self._nezha_passes
        summed = [None if g is None else acc.value + jnp.asarray(g, acc.dtype)
                  for acc, g in zip(self._nezha_accumulators, grads)]
        count = self._nezha_count.value + 1
        is_update = count >= passes
        present = [i for i, s in enumerate(summed) if s is not None]

        def reduce_branch(values):
            return self._nezha_reduce([v / passes if self._nezha_average_aggregated else v
                                       for v in values])

        def skip_branch(values):
            return [jnp.zeros_like(v) for v in values]

        reduced = list(grads)
        if present:
            outs = jax.lax.cond(is_update, reduce_branch, skip_branch, [summed[i] for i in present])
            for i, out in zip(present, outs):
                reduced[i] = out
        old_model = [v.value for v in variables]
        old_state = [v.value for v in self.variables]
        super().apply(reduced, trainable_variables)
        for var, old in zip(variables, old_model):
            var.assign(jnp.where(is_update, var.value, old))
        for var, old in zip(self.variables, old_state):
            var.assign(jnp.where(is_update, var.value, old))
        for acc, s in zip(self._nezha_accumulators, summed):
            if s is not None:
                acc.assign(jnp.where(is_update, jnp.zeros_like(s), s))
        self._nezha_count.assign(jnp.where(is_update, 0, count))


def DistributedOptimizer(optimizer, name=None, device_dense='', device_sparse='',
                         compression=Compression.none, sparse_as_dense=False, gradient_predivide_factor=1.0,
                         op=Average, backward_passes_per_step=1,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set, scale_local_gradients=True):
    """An optimizer of `optimizer`'s class (same config, fresh state) whose `apply()` first
    averages the gradients over all ranks (Horovod's arguments; `num_groups`/`groups` accepted,
    the engine fuses a step's gradients in one submission; sparse gradients (TF's IndexedSlices of an
    Embedding) are always reduced dense, as with `sparse_as_dense=True`)."""
    member_of(process_set)  # registered (a rank outside it steps on its own gradients)
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError("DistributedOptimizer expects a Keras 3 optimizer, got %s"
                        % type(optimizer).__name__)
    if isinstance(optimizer, _DistributedOptimizer):
        raise ValueError("optimizer is already a DistributedOptimizer")
    op = resolve_op(op, None)
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor is supported only with op == Average")
    if int(backward_passes_per_step) < 1:
        raise ValueError("backward_passes_per_step must be >= 1")
    _backend._cast_dtype(compression)  # refuses an unknown compressor now, not in the train step
    base = optimizer.__class__
    # Named and placed like the user's class: a saved model records that class, so plain
    # keras.models.load_model restores the plain optimizer and nezha.keras.load_model wraps it.
    cls = type(base.__name__, (_DistributedOptimizer, base), {"__module__": base.__module__})
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    wrapped = cls.from_config(config)
    wrapped._nezha_op = op
    wrapped._nezha_predivide = float(gradient_predivide_factor)
    wrapped._nezha_compression = compression
    wrapped._nezha_passes = int(backward_passes_per_step)
    wrapped._nezha_average_aggregated = bool(average_aggregated_gradients)
    wrapped._nezha_reduced_outside = False
    wrapped._nezha_process_set = process_set
    wrapped._nezha_reduces = reduces_gradients_over(process_set)
    return wrapped
