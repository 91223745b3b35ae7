"""Averaging a step's gradients over ranks: `DistributedGradientTape` and the TF
`DistributedOptimizer` (Keras optimizers go to nezha.keras; TF1 optimizers are wrapped here).

Every dense gradient of a step is reduced in one host call (all submitted before any is waited
for, so the engine fuses them); IndexedSlices are allgathered as Horovod does unless
`sparse_as_dense`. `num_groups`/`groups` are accepted: the engine fuses a step's gradients
whatever their grouping.
"""
import keras
import tensorflow as tf

from nezha.gradients import scale_factors
from nezha.horovod_api import Average, resolve_op
from nezha.process_sets import global_process_set, member_of, reduces_gradients_over
from nezha.tensorflow import functions, mpi_ops
from nezha.tensorflow.compression import Compression


def allreduce_gradients(grads, compression=Compression.none, sparse_as_dense=False, op=Average,
                        gradient_predivide_factor=1.0, name=None, process_set=global_process_set):
    """The list `grads` (None entries stay None) reduced over the set's ranks: Horovod's gradient
    rule (average split by gradient_predivide_factor around the sum)."""
    op = resolve_op(op, None)
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor is supported only with op == Average")
    prescale, postscale = scale_factors(op, gradient_predivide_factor)
    out = list(grads)
    if not reduces_gradients_over(process_set):
        # Horovod's _allreduce_cond: a rank outside the set (or a set of one) keeps its own.
        return out
    dense = []
    for i, g in enumerate(out):
        if g is None:
            continue
        if isinstance(g, tf.IndexedSlices):
            if not sparse_as_dense:  # allgathered: the predivide split (product 1) is moot
                out[i] = functions.allreduce(g, op=op, process_set=process_set)
                continue
            out[i] = tf.convert_to_tensor(g)
        dense.append(i)
    pairs = [compression.compress(out[i]) for i in dense]
    reduced = mpi_ops.grouped_allreduce_raw([p[0] for p in pairs], name, op, prescale, postscale,
                                            process_set)
    for i, r, (_, ctx) in zip(dense, reduced, pairs):
        out[i] = compression.decompress(r, ctx)
    return out


def _tape_gradient(self, target, sources, output_gradients=None,
                   unconnected_gradients=tf.UnconnectedGradients.NONE):
    grads = super(self.__class__, self).gradient(target, sources, output_gradients,
                                                 unconnected_gradients)
    flat_sources = tf.nest.flatten(sources)
    flat_grads = tf.nest.flatten(grads, expand_composites=False)
    local = {id(v) for v in self._nezha_local_sources}
    shared = [i for i, v in enumerate(flat_sources) if id(v) not in local]
    opts = self._nezha_options
    reduced = allreduce_gradients([flat_grads[i] for i in shared], **opts)
    for i, g in zip(shared, reduced):
        flat_grads[i] = g
    if self._nezha_scale_local and local and reduces_gradients_over(opts["process_set"]):
        # Horovod divides local gradients by the set's size too (its pull 3695), so a step moves
        # local and reduced variables alike.
        size = float(opts["process_set"].size())
        for i, (v, g) in enumerate(zip(flat_sources, flat_grads)):
            if id(v) in local and g is not None:
                flat_grads[i] = (tf.IndexedSlices(g.values / size, g.indices, g.dense_shape)
                                 if isinstance(g, tf.IndexedSlices) else g / size)
    return tf.nest.pack_sequence_as(sources, flat_grads)


def _register_local_source(self, source):
    """Keeps `source`'s gradient local (not reduced), as Horovod's tape does."""
    self._nezha_local_sources.append(source)


def _local_and_global_gradients(self, target, sources, output_gradients=None):
    """Horovod's split of gradient(): ([(local source, gradient)], [(other source, gradient)])."""
    grads = self.gradient(target, sources, output_gradients)
    local = {id(v) for v in self._nezha_local_sources}
    pairs = list(zip(sources, grads))
    return ([p for p in pairs if id(p[0]) in local], [p for p in pairs if id(p[0]) not in local])


def DistributedGradientTape(gradtape, device_dense='', device_sparse='',
                            compression=Compression.none, sparse_as_dense=False, op=Average,
                            gradient_predivide_factor=1.0, num_groups=0, groups=None,
                            process_set=global_process_set, scale_local_gradients=True):
    """A tape like `gradtape` whose `gradient()` returns gradients averaged over all ranks (of
    the process set; on a rank outside the set, its own gradients)."""
    member_of(process_set)  # registered (this rank may be outside it)
    resolve_op(op, None)
    cls = type(gradtape.__class__.__name__, (gradtape.__class__,),
               {"gradient": _tape_gradient, "register_local_source": _register_local_source,
                "get_local_and_global_gradients": _local_and_global_gradients})
    tape = cls.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)
    tape._nezha_local_sources = []
    tape._nezha_scale_local = scale_local_gradients
    tape._nezha_options = dict(compression=compression, sparse_as_dense=sparse_as_dense, op=op,
                               gradient_predivide_factor=gradient_predivide_factor,
                               process_set=process_set)
    return tape


def PartialDistributedGradientTape(gradtape, device_dense='', device_sparse='',
                                   compression=Compression.none, sparse_as_dense=False,
                                   op=Average, gradient_predivide_factor=1.0, num_groups=0,
                                   groups=None, process_set=global_process_set, local_layers=None,
                                   scale_local_gradients=True):
    """DistributedGradientTape whose `local_layers` (Keras layers) keep their gradients local."""
    if local_layers is None:
        local_layers = []
    elif isinstance(local_layers, keras.layers.Layer):
        local_layers = [local_layers]
    elif not all(isinstance(layer, keras.layers.Layer) for layer in local_layers):
        raise ValueError("every local layer must be a keras.layers.Layer")
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression,
                                   sparse_as_dense, op, gradient_predivide_factor, num_groups,
                                   groups, process_set, scale_local_gradients)
    for layer in local_layers:
        for var in layer.trainable_weights:
            tape.register_local_source(var)
    return tape


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense='',
                         device_sparse='', compression=Compression.none, sparse_as_dense=False,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set, scale_local_gradients=True):
    """Horovod's TF DistributedOptimizer: a Keras optimizer (tf.keras.optimizers.* is Keras 3
    here) becomes nezha.keras's DistributedOptimizer; a tf.compat.v1.train.Optimizer gets its
    compute_gradients() averaged over ranks (a rank outside `process_set` keeps its own)."""
    member_of(process_set)  # registered (this rank may be outside it)
    import keras
    if isinstance(optimizer, keras.optimizers.Optimizer):
        from nezha.keras.optimizer import DistributedOptimizer as KerasDistributedOptimizer
        return KerasDistributedOptimizer(
            optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
            gradient_predivide_factor=gradient_predivide_factor, op=op,
            backward_passes_per_step=backward_passes_per_step,
            average_aggregated_gradients=average_aggregated_gradients, num_groups=num_groups,
            groups=groups, process_set=process_set)
    if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
        raise TypeError("DistributedOptimizer expects a Keras or tf.compat.v1.train optimizer, "
                        "got %s" % type(optimizer).__name__)
    if backward_passes_per_step != 1:
        raise NotImplementedError("backward_passes_per_step > 1 with a tf.compat.v1 optimizer; "
                                  "use a Keras optimizer")
    options = dict(compression=compression, sparse_as_dense=sparse_as_dense, op=op,
                   gradient_predivide_factor=gradient_predivide_factor, process_set=process_set)

    def compute_gradients(self, *args, **kwargs):
        pairs = super(self.__class__, self).compute_gradients(*args, **kwargs)
        reduced = allreduce_gradients([g for g, _ in pairs], **options)
        return list(zip(reduced, [v for _, v in pairs]))

    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               {"compute_gradients": compute_gradients})
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)
    return wrapped
