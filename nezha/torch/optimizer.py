"""DistributedOptimizer: averages gradients over ranks while backward is still running.

A hook per parameter (`register_post_accumulate_grad_hook`) fires once that parameter's gradient
is fully accumulated and submits its allreduce at once, so communication of late layers overlaps
the backward of early ones; `step()` only waits. Every submission is keyed by the parameter's
name, so ranks may finish gradients in different orders. Parameters a rank did not use are
submitted (as zeros) by `synchronize()`, so a rank never waits for a gradient that is not coming.
"""

import warnings
from contextlib import contextmanager

import torch

from nezha.torch import mpi_ops
from nezha.torch.basics import (Adasum, Average, check_process_set, global_process_set,
                                resolve_op, size)
from nezha.torch.compression import Compression
from nezha.torch.functions import broadcast_object
from nezha.torch.handles import synchronize


class _DistributedOptimizerMixin:
    """Placed before the wrapped optimizer's class in the MRO; `super()` reaches its methods."""

    def _nezha_setup(self, named_parameters, compression, backward_passes_per_step, op,
                     gradient_predivide_factor, groups, sparse_as_dense):
        self._compression = compression
        self.backward_passes_per_step = backward_passes_per_step
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self._parameter_names = _name_parameters(self.param_groups, named_parameters)
        trainable = sorted((p for g in self.param_groups for p in g["params"] if p.requires_grad),
                           key=self._parameter_names.get)
        self._bucket_of = _form_buckets(trainable, groups, self._parameter_names)
        self._passes_left = {p: backward_passes_per_step for p in self._parameter_names}
        self._ready = {}        # bucket -> parameters whose gradient is final for this step
        self._handles = {}      # bucket -> (handle, compression contexts)
        self._synchronized = False
        self._should_synchronize = True
        self._hook_handles = []
        if size() > 1:
            for p in trainable:
                self._hook_handles.append(p.register_post_accumulate_grad_hook(self._on_grad))

    # -- gradient hooks -------------------------------------------------------------------------

    def _on_grad(self, p):
        if self._passes_left[p] <= 0:
            raise AssertionError(
                "Gradient of %r was computed more than backward_passes_per_step=%d times before "
                "step(). Increase backward_passes_per_step to accumulate gradients locally."
                % (self._parameter_names[p], self.backward_passes_per_step))
        self._passes_left[p] -= 1
        if self._passes_left[p] > 0:
            return
        bucket = self._bucket_of[p]
        ready = self._ready.setdefault(bucket, set())
        ready.add(p)
        if len(ready) == len(bucket):
            self._submit(bucket)

    def _submit(self, bucket):
        for p in bucket:
            if p.grad is None:  # unused on this rank; another rank may have used it
                p.grad = torch.zeros_like(p)
        if self.op == Average:
            # Horovod's split of the average: the engine folds 1/size into the postscale.
            prescale = 1.0 / self.gradient_predivide_factor
            postscale = self.gradient_predivide_factor
        else:
            prescale = postscale = 1.0
        if len(bucket) == 1 and bucket[0].grad.is_sparse and not self.sparse_as_dense:
            self._handles[bucket] = (mpi_ops.sparse_allreduce_async(
                bucket[0].grad, self._parameter_names[bucket[0]], self.op), None)
            return
        # sparse_as_dense: a dense copy is reduced; synchronize() hands the result back as a
        # sparse gradient (optimizers such as SparseAdam accept nothing else), as Horovod does.
        grads = [p.grad.to_dense() if p.grad.is_sparse else p.grad for p in bucket]
        compressed, ctxs = zip(*[self._compression.compress(g) for g in grads])
        name = self._parameter_names[bucket[0]]
        if len(bucket) == 1:
            handle = mpi_ops.allreduce_async_(compressed[0], name=name, op=self.op,
                                              prescale_factor=prescale, postscale_factor=postscale)
        else:
            handle = mpi_ops.grouped_allreduce_async_(list(compressed), name=name, op=self.op,
                                                      prescale_factor=prescale,
                                                      postscale_factor=postscale)
        self._handles[bucket] = (handle, ctxs)

    # -- public API -----------------------------------------------------------------------------

    def synchronize(self):
        """Waits until every gradient is averaged over ranks (submitting any not yet submitted)."""
        if size() > 1:
            for bucket in set(self._bucket_of.values()):
                if bucket not in self._handles and any(p.requires_grad for p in bucket):
                    self._submit(bucket)
            for bucket, (handle, ctxs) in list(self._handles.items()):
                if ctxs is None:  # sparse
                    bucket[0].grad = handle.wait()
                else:
                    results = synchronize(handle)
                    results = results if isinstance(results, list) else [results]
                    for p, result, ctx in zip(bucket, results, ctxs):
                        reduced = self._compression.decompress(result, ctx)
                        if p.grad.is_sparse:  # reduced as dense (sparse_as_dense)
                            p.grad = reduced.to_sparse(p.grad.sparse_dim()).coalesce()
                        elif reduced is not p.grad:
                            p.grad.copy_(reduced)
                for p in bucket:
                    self._passes_left[p] = self.backward_passes_per_step
            self._handles.clear()
            self._ready.clear()
        self._synchronized = True

    @contextmanager
    def skip_synchronize(self):
        """`step()` inside this block does not synchronize (use after an explicit synchronize())."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() after "
                              "optimizer.synchronize(); gradients are synchronized twice.")
            self.synchronize()
        self._synchronized = False
        return super().step(closure)

    def zero_grad(self, set_to_none=True):
        if self._handles or self._ready:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize(); the "
                                 "gradients are still being averaged (in place).")
        return super().zero_grad(set_to_none=set_to_none)

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        for p in self._passes_left:
            self._passes_left[p] = passes

    def load_state_dict(self, state_dict):
        self._handles.clear()
        self._ready.clear()
        self._synchronized = False
        self._should_synchronize = True
        self.set_backward_passes_per_step(self.backward_passes_per_step)
        return super().load_state_dict(state_dict)


def _name_parameters(param_groups, named_parameters):
    if named_parameters is not None:
        named_parameters = list(named_parameters)
    else:
        named_parameters = [("allreduce.noname.%d.%d" % (g, i), p)
                            for g, group in enumerate(param_groups)
                            for i, p in enumerate(group["params"])]
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
    unnamed = [p for g in param_groups for p in g["params"] if p not in names]
    if unnamed:
        raise ValueError("named_parameters was given, but %d optimizer parameter(s) are not in it "
                         "(shapes: %s)" % (len(unnamed), [tuple(p.shape) for p in unnamed]))
    return names


def _form_buckets(trainable, groups, names):
    """Parameter -> the tuple of parameters reduced together with it (a 1-tuple without groups)."""
    if groups is None or groups == 0:
        return {p: (p,) for p in trainable}
    if isinstance(groups, int):
        if groups < 0:
            raise ValueError("groups must be a non-negative int or a list of parameter lists")
        # Every rank must form identical groups: take rank 0's order of names.
        order = broadcast_object([names[p] for p in trainable], root_rank=0,
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
    bucket_of = {}
    for group in groups:
        bucket = tuple(sorted((p for p in group if p.requires_grad), key=names.get))
        for p in bucket:
            if p in bucket_of:
                raise ValueError("parameter %r appears in two groups" % names[p])
            bucket_of[p] = bucket
    for p in trainable:
        bucket_of.setdefault(p, (p,))
    return bucket_of


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set):
    """Wraps `optimizer` so that `step()` applies gradients averaged (or summed) over all ranks.

    The result is an instance of a subclass of `optimizer`'s class that shares its state and
    param_groups, so `isinstance` checks, LR schedulers and GradScaler keep working.
    """
    op = resolve_op(op, None)
    if op is Adasum:  # resolve_op already refused it; kept for readers looking for Adasum
        raise NotImplementedError("Adasum")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor is supported only with op == Average")
    if backward_passes_per_step < 1:
        raise ValueError("backward_passes_per_step must be >= 1")
    check_process_set(process_set)
    if num_groups and groups is None:
        groups = num_groups
    cls = type(optimizer.__class__.__name__, (_DistributedOptimizerMixin, optimizer.__class__), {})
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)
    wrapped._nezha_setup(named_parameters, compression, backward_passes_per_step, op,
                         gradient_predivide_factor, groups, sparse_as_dense)
    return wrapped
