"""nezha.tensorflow and nezha.keras take Horovod 0.28.1's parameters, in its order (names and
order from horovod/tensorflow/{__init__,mpi_ops,functions}.py and horovod/tensorflow/keras)."""
import inspect

import pytest

pytest.importorskip("tensorflow")

GS = "process_set"
HOROVOD_TF = {
    "allreduce": ["tensor", "average", "device_dense", "device_sparse", "compression", "op",
                  "prescale_factor", "postscale_factor", "name", GS, "ignore_name_scope"],
    "grouped_allreduce": ["tensors", "average", "device_dense", "device_sparse", "compression",
                          "op", "prescale_factor", "postscale_factor", GS, "ignore_name_scope"],
    "allgather": ["tensor", "name", "ignore_name_scope", GS],
    "grouped_allgather": ["tensors", "name", "ignore_name_scope", GS],
    "broadcast": ["tensor", "root_rank", "name", "ignore_name_scope", GS],
    "broadcast_": ["variables", "root_rank", "name", GS],
    "alltoall": ["tensor", "splits", "name", "ignore_name_scope", GS],
    "reducescatter": ["tensor", "device_dense", "compression", "op", "name", GS,
                      "ignore_name_scope", "prescale_factor", "postscale_factor"],
    "grouped_reducescatter": ["tensors", "device_dense", "compression", "op", GS,
                              "ignore_name_scope", "prescale_factor", "postscale_factor"],
    "join": [],
    "barrier": [GS],
    "broadcast_variables": ["variables", "root_rank", GS, "inplace"],
    "broadcast_object": ["obj", "root_rank", "session", "name", GS],
    "broadcast_global_variables": ["root_rank"],
    "size_op": ["process_set_id", "name"],
    "local_size_op": ["name"],
    "rank_op": ["name"],
    "local_rank_op": ["name"],
    "PartialDistributedGradientTape": ["gradtape", "device_dense", "device_sparse", "compression",
                                       "sparse_as_dense", "op", "gradient_predivide_factor",
                                       "num_groups", "groups", GS, "local_layers",
                                       "scale_local_gradients"],
    "allgather_object": ["obj", "session", "name", GS],
    "DistributedGradientTape": ["gradtape", "device_dense", "device_sparse", "compression",
                                "sparse_as_dense", "op", "gradient_predivide_factor",
                                "num_groups", "groups", GS, "scale_local_gradients"],
    "DistributedOptimizer": ["optimizer", "name", "use_locking", "device_dense", "device_sparse",
                             "compression", "sparse_as_dense", "backward_passes_per_step", "op",
                             "gradient_predivide_factor", "average_aggregated_gradients",
                             "num_groups", "groups", GS, "scale_local_gradients"],
}
HOROVOD_KERAS = {
    "DistributedOptimizer": ["optimizer", "name", "device_dense", "device_sparse", "compression",
                             "sparse_as_dense", "gradient_predivide_factor", "op",
                             "backward_passes_per_step", "average_aggregated_gradients",
                             "num_groups", "groups", GS, "scale_local_gradients"],
    "allreduce": ["value", "name", "average", "prescale_factor", "postscale_factor", "op",
                  "compression"],
    "load_model": ["filepath", "custom_optimizers", "custom_objects", "compression"],
}
HOROVOD_CALLBACKS = {
    "BroadcastGlobalVariablesCallback": ["root_rank", "device"],
    "MetricAverageCallback": ["device"],
    "LearningRateScheduleCallback": ["initial_lr", "multiplier", "start_epoch", "end_epoch",
                                     "staircase", "momentum_correction", "steps_per_epoch"],
    "LearningRateWarmupCallback": ["initial_lr", "warmup_epochs", "momentum_correction",
                                   "steps_per_epoch", "verbose"],
    "BestModelCheckpoint": ["monitor", "verbose", "mode", "save_freq"],
}


def _params(fn):
    return list(inspect.signature(fn).parameters)


@pytest.mark.parametrize("module, table", [
    ("nezha.tensorflow", HOROVOD_TF), ("nezha.keras", HOROVOD_KERAS),
    ("nezha.tensorflow.keras", HOROVOD_KERAS), ("nezha.keras.callbacks", HOROVOD_CALLBACKS)])
def test_horovod_parameters_in_order(module, table):
    import importlib
    mod = importlib.import_module(module)
    for name, expected in table.items():
        got = _params(getattr(mod, name))
        # Horovod's parameters come first and in order; Nezha may add keyword ones after them.
        assert got[:len(expected)] == expected, "%s.%s: %s" % (module, name, got)
