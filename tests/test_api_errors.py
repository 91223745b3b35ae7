"""Bad calls get clear Python exceptions, never a crash or a hang (single process)."""
import numpy as np
import pytest

import nezha


@pytest.fixture
def single(monkeypatch):
    for k in list(__import__("os").environ):
        if k.startswith(("NEZHA_RANK", "NEZHA_SIZE", "RANK", "WORLD_SIZE", "OMPI_", "PMI_", "SLURM_")):
            monkeypatch.delenv(k)
    nezha.init()
    yield
    nezha.shutdown()


def test_calls_before_init_and_after_shutdown_say_so(single):
    nezha.shutdown()
    with pytest.raises(nezha.NotInitializedError, match="init"):
        nezha.allreduce(np.ones(3))
    with pytest.raises(nezha.NezhaError):
        nezha.rank()
    nezha.init()  # init after shutdown works again
    assert nezha.allreduce(np.ones(3), op=nezha.Sum).tolist() == [1, 1, 1]


def test_non_contiguous_array_is_rejected(single):
    with pytest.raises(ValueError, match="contiguous"):
        nezha.allreduce(np.ones((4, 4))[:, ::2])


@pytest.mark.parametrize("bad", [np.ones(3, np.complex64), np.array(["a", "b"]),
                                 np.ones(3, np.uint32)])
def test_unsupported_dtypes_are_rejected(single, bad):
    with pytest.raises((ValueError, TypeError), match="dtype"):
        nezha.allreduce(bad)


def test_wrong_arguments(single):
    with pytest.raises(ValueError, match="root_rank"):
        nezha.broadcast(np.ones(3), root_rank=1)
    with pytest.raises(ValueError, match="splits"):
        nezha.alltoall(np.ones((4, 2)), splits=[1, 2])
    with pytest.raises(ValueError, match="op must be"):
        nezha.allreduce(np.ones(3), op="sum")
    with pytest.raises(ValueError, match="out has shape"):
        nezha.allreduce(np.ones(3), out=np.ones(4))
    with pytest.raises(TypeError, match="expected a numpy array"):
        nezha.allreduce(object())


def test_single_process_results_equal_inputs(single):
    x = np.arange(10, dtype=np.float32)
    assert np.array_equal(nezha.allreduce(x, op=nezha.Average), x)
    assert np.array_equal(nezha.allgather(x), x)
    assert np.array_equal(nezha.broadcast(x, 0), x)
    out, splits = nezha.alltoall(x.reshape(5, 2))
    assert np.array_equal(out, x.reshape(5, 2)) and splits.tolist() == [5]
    assert np.array_equal(nezha.reducescatter(x.reshape(5, 2), op=nezha.Sum), x.reshape(5, 2))
    assert nezha.join() == 0
    nezha.barrier()


def test_name_reused_while_in_flight(job):
    result = job(2, "reuse_name.py", timeout=60)
    assert result.returncode == 0, result.output
    assert "OK" in result.lines(0)


@pytest.mark.parametrize("array,kwargs", [
    (np.ones(3, bool), dict(op=nezha.Average)),
    (np.ones(3, bool), dict(op=nezha.Max, postscale_factor=2.0)),
    (np.ones(3, bool), dict(op=nezha.Sum, prescale_factor=0.5)),
    (np.ones(3, np.int32), dict(op=nezha.Sum, postscale_factor=float("inf"))),
    (np.ones(3, np.int64), dict(op=nezha.Sum, prescale_factor=float("nan"))),
])
def test_scaling_a_dtype_that_cannot_be_scaled_is_rejected_and_the_engine_goes_on(single, array, kwargs):
    # Once the engine stopped on these ("engine stopped: scale: bool tensors cannot be scaled").
    with pytest.raises(ValueError, match="tensor 'bad_scale'.*(bool|integer)"):
        nezha.allreduce(array, name="bad_scale", **kwargs)
    with pytest.raises(ValueError, match="bad_scale"):
        nezha.reducescatter(np.ones(4, array.dtype), name="bad_scale", **kwargs)
    assert nezha.allreduce(np.arange(3.0), op=nezha.Average, postscale_factor=2.0).tolist() == [0, 2, 4]
