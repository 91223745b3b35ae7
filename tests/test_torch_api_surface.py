"""nezha.torch's signatures against horovod.torch 0.28.1's (issue 16), in one process.

Horovod's parameters below were read from horovod/torch/{mpi_ops,functions,optimizer}.py: every
name in order, with its default. Ours must take the same parameters in the same order with the same
defaults, so positional and keyword calls bind alike; Nezha may add parameters after them. The
COMPATIBILITY.md table says the same in words.
"""

import inspect

import pytest

torch = pytest.importorskip("torch")
import nezha.torch as hvd  # noqa: E402

GPS = "global_process_set"
ALLREDUCE = ["tensor", "average=None", "name=None", "op=None", "prescale_factor=1.0",
             "postscale_factor=1.0", "process_set=" + GPS]
GROUPED_ALLREDUCE = ["tensors"] + ALLREDUCE[1:]
WITH_COMPRESSION = ["tensor", "average=None", "name=None", "compression=Compression.none",
                    "op=None", "prescale_factor=1.0", "postscale_factor=1.0", "process_set=" + GPS]
BROADCAST = ["tensor", "root_rank", "name=None", "process_set=" + GPS]
REDUCESCATTER = ["tensor", "name=None", "op=Average", "process_set=" + GPS, "prescale_factor=1.0",
                 "postscale_factor=1.0"]
REDUCESCATTER_SYNC = REDUCESCATTER[:2] + ["compression=Compression.none"] + REDUCESCATTER[2:]

HOROVOD = {
    "allreduce": WITH_COMPRESSION, "allreduce_async": ALLREDUCE, "allreduce_": ALLREDUCE,
    "allreduce_async_": ALLREDUCE,
    "grouped_allreduce": ["tensors"] + WITH_COMPRESSION[1:],
    "grouped_allreduce_async": GROUPED_ALLREDUCE, "grouped_allreduce_": GROUPED_ALLREDUCE,
    "grouped_allreduce_async_": GROUPED_ALLREDUCE,
    "sparse_allreduce_async": ["tensor", "name", "op", "process_set=" + GPS],
    "allgather": ["tensor", "name=None", "process_set=" + GPS],
    "allgather_async": ["tensor", "name=None", "process_set=" + GPS],
    "grouped_allgather": ["tensors", "name=None", "process_set=" + GPS],
    "grouped_allgather_async": ["tensors", "name=None", "process_set=" + GPS],
    "broadcast": BROADCAST, "broadcast_async": BROADCAST, "broadcast_": BROADCAST,
    "broadcast_async_": BROADCAST,
    "alltoall": ["tensor", "splits=None", "name=None", "process_set=" + GPS],
    "alltoall_async": ["tensor", "splits=None", "name=None", "process_set=" + GPS],
    "reducescatter": REDUCESCATTER_SYNC, "reducescatter_async": REDUCESCATTER,
    "grouped_reducescatter": ["tensors"] + REDUCESCATTER_SYNC[1:],
    "grouped_reducescatter_async": ["tensors"] + REDUCESCATTER[1:],
    "join": ["device=-1"], "barrier": ["process_set=" + GPS], "poll": ["handle"],
    "synchronize": ["handle"],
    "allgather_object": ["obj", "name=None"],
    "broadcast_object": ["obj", "root_rank=0", "name=None", "process_set=" + GPS],
    "broadcast_optimizer_state": ["optimizer", "root_rank", "model=None"],
    "broadcast_parameters": ["params", "root_rank"],
    "DistributedOptimizer": ["optimizer", "named_parameters=None", "compression=Compression.none",
                             "backward_passes_per_step=1", "op=Average",
                             "gradient_predivide_factor=1.0", "num_groups=0", "groups=None",
                             "sparse_as_dense=False", "process_set=" + GPS],
    "SyncBatchNorm": ["num_features", "eps=1e-05", "momentum=0.1", "affine=True",
                      "track_running_stats=True"],
}
NAMESPACE = {"Compression": hvd.Compression, "Average": hvd.Average,
             "global_process_set": hvd.global_process_set}


@pytest.mark.parametrize("name", sorted(HOROVOD))
def test_parameters_and_defaults_match_horovod(name):
    params = list(inspect.signature(getattr(hvd, name)).parameters.values())
    params = [p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    expected = HOROVOD[name]
    assert len(params) >= len(expected), (name, params)
    for p, want in zip(params, expected):
        want_name, _, want_default = want.partition("=")
        assert p.name == want_name, (name, [q.name for q in params])
        if want_default:
            assert p.default == eval(want_default, dict(NAMESPACE)), (name, p.name, p.default)
        else:
            assert p.default is p.empty, (name, p.name, p.default)
    for extra in params[len(expected):]:  # Nezha's own additions never need a value
        assert extra.default is not extra.empty, (name, extra.name)


def test_every_horovod_torch_name_exists():
    names = """Average Sum Adasum Min Max Product HorovodInternalError ProcessSet global_process_set
        add_process_set remove_process_set init shutdown is_initialized start_timeline
        stop_timeline size local_size cross_size rank local_rank cross_rank mpi_threads_supported
        mpi_enabled mpi_built gloo_enabled gloo_built nccl_built ddl_built ccl_built cuda_built
        rocm_built is_homogeneous Compression elastic""".split() + sorted(HOROVOD)
    assert [n for n in names if not hasattr(hvd, n)] == []
    assert issubclass(hvd.HorovodInternalError, RuntimeError)
    for compressor in (hvd.Compression.none, hvd.Compression.fp16):
        assert callable(compressor.compress) and callable(compressor.decompress)
    assert hasattr(hvd.elastic, "run") and hasattr(hvd.elastic, "TorchState")
    assert hasattr(hvd.elastic, "ElasticSampler")


def test_unsupported_tensors_raise_what_horovod_raises():
    # Horovod raises ValueError('Tensor type ... is not supported.'); ours is also a TypeError.
    for attempt in (lambda: hvd.allreduce_async(torch.zeros(2, dtype=torch.complex64)),
                    lambda: hvd.allgather_async(torch.zeros(2, dtype=torch.uint32)),
                    lambda: hvd.broadcast_async(torch.zeros(2, dtype=torch.complex128), 0)):
        with pytest.raises(ValueError):
            attempt()
        with pytest.raises(TypeError):
            attempt()
