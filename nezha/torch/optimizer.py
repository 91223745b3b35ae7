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

from nezha.compression import compress_all, decompress_all
from nezha.gradients import GradientReducer, name_parameters
from nezha.horovod_api import Average, resolve_op
from nezha.process_sets import global_process_set, member_of, reduces_gradients_over
from nezha.torch import mpi_ops
from nezha.torch.compression import Compression


def _reducer_attribute(name):
    """One of Horovod's optimizer attributes, kept (and read at each use) by the bookkeeping."""
    return property(lambda self: getattr(self._reducer, name),
                    lambda self, value: setattr(self._reducer, name, value))


class _DistributedOptimizerMixin:
    """Placed before the wrapped optimizer's class in the MRO; `super()` reaches its methods.
    The bookkeeping (names, buckets, passes, predivide) is nezha.gradients'; this class hooks
    torch's gradients to it and reads and writes them."""

    def _nezha_setup(self, named_parameters, compression, backward_passes_per_step, op,
                     gradient_predivide_factor, groups, sparse_as_dense, process_set):
        self._compression = compression
        self._process_set = process_set  # gradients are reduced among its ranks
        # A rank outside the set (or a set of one) steps on its own gradients, as in Horovod: no
        # hooks, nothing submitted, synchronize() returns at once.
        self._reduces = reduces_gradients_over(process_set)
        self.sparse_as_dense = sparse_as_dense
        params = [group["params"] for group in self.param_groups]
        self._reducer = GradientReducer(
            name_parameters(params, named_parameters),
            [p for group in params for p in group if p.requires_grad], groups,
            backward_passes_per_step, op, gradient_predivide_factor, self._submit, self._finish,
            still_trainable=lambda p: p.requires_grad)
        self._synchronized = False
        self._should_synchronize = True
        self._hook_handles = []
        if self._reduces:
            for p in self._reducer.trainable:
                self._hook_handles.append(
                    p.register_post_accumulate_grad_hook(self._reducer.ready))

    backward_passes_per_step = _reducer_attribute("backward_passes_per_step")
    # Horovod's map of parameter -> the name its gradient is reduced under (scripts read it).
    _parameter_names = property(lambda self: self._reducer.names)
    op = _reducer_attribute("op")
    gradient_predivide_factor = _reducer_attribute("gradient_predivide_factor")

    # -- the two callables the bookkeeping calls ------------------------------------------------

    def _submit(self, bucket, name, op, prescale, postscale):
        for p in bucket:
            if p.grad is None:  # unused on this rank; another rank may have used it
                p.grad = torch.zeros_like(p)
        if len(bucket) == 1 and bucket[0].grad.is_sparse and not self.sparse_as_dense:
            return mpi_ops.sparse_allreduce_async(bucket[0].grad, name, op,
                                                  self._process_set).then(lambda g: [g])
        # sparse_as_dense: a dense copy is reduced; _finish hands the result back as a sparse
        # gradient (optimizers such as SparseAdam accept nothing else), as Horovod does.
        grads = [p.grad.to_dense() if p.grad.is_sparse else p.grad for p in bucket]
        compressed, ctxs = compress_all(self._compression, grads)
        if len(bucket) == 1:
            handle = mpi_ops.allreduce_async_(compressed[0], name=name, op=op,
                                              prescale_factor=prescale, postscale_factor=postscale,
                                              process_set=self._process_set)
            handle = handle.then(lambda result: [result])
        else:
            handle = mpi_ops.grouped_allreduce_async_(compressed, name=name, op=op,
                                                      prescale_factor=prescale,
                                                      postscale_factor=postscale,
                                                      process_set=self._process_set)
        return handle.then(lambda results: decompress_all(self._compression, results, ctxs))

    @staticmethod
    def _finish(bucket, results):
        for p, reduced in zip(bucket, results):
            if reduced.is_sparse:  # allgathered as sparse
                p.grad = reduced
            elif p.grad.is_sparse:  # reduced as dense (sparse_as_dense)
                p.grad = reduced.to_sparse(p.grad.sparse_dim()).coalesce()
            elif reduced is not p.grad:
                p.grad.copy_(reduced)

    # -- public API -----------------------------------------------------------------------------

    def synchronize(self):
        """Waits until every gradient is averaged over ranks (submitting any not yet submitted)."""
        if self._reduces:
            self._reducer.synchronize()
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
        if self._reducer.in_flight:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize(); the "
                                 "gradients are still being averaged (in place).")
        return super().zero_grad(set_to_none=set_to_none)

    def set_backward_passes_per_step(self, passes):
        self._reducer.set_backward_passes_per_step(passes)

    def load_state_dict(self, state_dict):
        self._reducer.reset()
        self._synchronized = False
        self._should_synchronize = True
        return super().load_state_dict(state_dict)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set):
    """Wraps `optimizer` so that `step()` applies gradients averaged (or summed) over all ranks.

    The result is an instance of a subclass of `optimizer`'s class that shares its state and
    param_groups, so `isinstance` checks, LR schedulers and GradScaler keep working.
    """
    op = resolve_op(op, None)  # refuses Adasum
    member_of(process_set)  # registered (this rank may be outside it)
    if num_groups and groups is None:
        groups = num_groups
    cls = type(optimizer.__class__.__name__, (_DistributedOptimizerMixin, optimizer.__class__), {})
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)
    wrapped._nezha_setup(named_parameters, compression, backward_passes_per_step, op,
                         gradient_predivide_factor, groups, sparse_as_dense, process_set)
    return wrapped
