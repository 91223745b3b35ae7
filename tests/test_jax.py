"""nezha.jax on 2 and 3 real ranks: collectives on pytrees eager and inside jit against
numpy, gradients, scan/cond, mismatches raising on every rank; the io_callback fallback; pmap and
optax/flax training against a single-process reference; importing nezha without jax."""
import os
import subprocess
import sys

import pytest

from torch_workers.harness import assert_every_rank_passed, run_workers

pytest.importorskip("jax")
pytest.importorskip("optax")

HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = os.path.join(HERE, "jax_workers")
COLLECTIVE_CHECKS = {"pytree allreduce eager and jit", "allgather broadcast reducescatter alltoall",
                     "gradients", "scan and cond", "ordering", "mismatch raises", "after mismatch",
                     "one large leaf"}


def _run(script, num_ranks, *args, env=None):
    # On the CPU backend even where jax has a GPU: the FFI handlers serve CPU buffers.
    return run_workers(os.path.join(WORKERS, script), num_ranks=num_ranks, timeout_s=150,
                       args=args, env={"NEZHA_TIMEOUT_S": "10", "JAX_PLATFORMS": "cpu", **(env or {})})


def _accelerator_backend():
    from nezha.jax._primitive import jit_platform
    backend = jit_platform()  # "cuda" or "rocm" where jax.default_backend() says "gpu"
    return None if backend == "cpu" else backend


@pytest.mark.timeout(180)
@pytest.mark.parametrize("num_ranks", [2, 3])
def test_collectives_ffi(num_ranks):
    import nezha.jax
    if not nezha.jax.ffi_available():
        pytest.fail("nezha._core was built without the XLA FFI handlers although jax is installed")
    output = _run("w_collectives.py", num_ranks, "ffi")
    assert_every_rank_passed(output, num_ranks, COLLECTIVE_CHECKS | {"path ffi", "crossed order",
                                                                     "small calls on the calling thread"})


@pytest.mark.timeout(180)
def test_collectives_io_callback_fallback():
    output = _run("w_collectives.py", 2, "callback", env={"NEZHA_JAX_FORCE_CALLBACK": "1"})
    assert_every_rank_passed(output, 2, COLLECTIVE_CHECKS | {"path callback"})


@pytest.mark.timeout(180)
@pytest.mark.skipif(_accelerator_backend() != "cuda", reason="jax has no CUDA backend here")
def test_collectives_inside_jit_on_cuda_through_the_ffi_handler():
    """Where jax.jit compiles for CUDA, collectives inside jit are the FFI custom call (device buffers
    staged through page-locked host memory on XLA's stream): the same checks against numpy, results
    on the device, kernels before and after the call in stream order."""
    output = _run("w_collectives.py", 2, "ffi",
                  env={"JAX_PLATFORMS": "", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"})
    assert_every_rank_passed(output, 2, COLLECTIVE_CHECKS | {"path ffi", "results on the accelerator"})


@pytest.mark.timeout(180)
@pytest.mark.skipif(_accelerator_backend() is None, reason="jax has no accelerator backend here")
def test_collectives_inside_jit_on_an_accelerator_through_the_callback():
    """The io_callback path on an accelerator (rocm or tpu have no FFI handler; forced on CUDA)."""
    output = _run("w_collectives.py", 2, "callback",
                  env={"JAX_PLATFORMS": "", "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
                       "NEZHA_JAX_FORCE_CALLBACK": "1"})
    assert_every_rank_passed(output, 2, COLLECTIVE_CHECKS | {"path callback", "results on the accelerator"})


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["ffi", "callback"])
def test_collectives_in_process_sets(mode):
    """Process sets: every collective eager and jitted among a set's members, a gradient in a set,
    overlapping sets' jitted collectives at once, a rank outside refused, DistributedOptimizer of a
    set (3 ranks; the FFI handler and the io_callback)."""
    env = {"NEZHA_JAX_FORCE_CALLBACK": "1"} if mode == "callback" else None
    output = _run("w_process_sets.py", 3, mode, env=env)
    assert_every_rank_passed(output, 3, {"collectives in a set", "overlapping sets", "optimizer of a set"})


@pytest.mark.timeout(180)
@pytest.mark.skipif(_accelerator_backend() != "cuda", reason="jax has no CUDA backend here")
def test_collectives_in_process_sets_on_cuda():
    """The same with jit compiling for CUDA: the set's id reaches the CUDA FFI handler."""
    output = _run("w_process_sets.py", 3, "ffi",
                  env={"JAX_PLATFORMS": "", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"})
    assert_every_rank_passed(output, 3, {"collectives in a set", "overlapping sets", "optimizer of a set"})


@pytest.mark.timeout(180)
def test_pmap_and_training():
    output = _run("w_training.py", 2)
    assert_every_rank_passed(output, 2, {"pmap", "DistributedOptimizer", "backward_passes_per_step",
                                         "objects"})


def test_nezha_imports_without_jax(tmp_path):
    """A finder that hides jax: `import nezha` works; `import nezha.jax` says what to install."""
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n"
        "class _Hide:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('jax', 'jaxlib', 'optax', 'flax'):\n"
        "            raise ImportError('hidden for this test: ' + name)\n"
        "sys.meta_path.insert(0, _Hide())\n")
    code = ("import nezha, sys\n"
            "nezha.init(); import numpy as np; assert nezha.allreduce(np.array([1.0, 2.0]), op=nezha.Sum).tolist() == [1.0, 2.0]\n"
            "assert 'jax' not in sys.modules\n"
            "try:\n    import nezha.jax\nexcept ImportError as e:\n    print('ERR', e)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEZHA_")}
    env["PYTHONPATH"] = str(tmp_path) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "ERR nezha.jax needs jax: pip install 'nezha[jax]'" in out.stdout, out.stdout


def test_build_without_ffi_falls_back_and_says_so():
    """A _core without the handlers (as built where jaxlib's headers were missing): ffi_available()
    is False, a RuntimeWarning says so once, and jitted collectives still work (one process)."""
    code = (
        "import warnings, numpy as np, nezha._core as core\n"
        "del core.jax_ffi_targets\n"
        "import jax, jax.numpy as jnp, nezha.jax as nj\n"
        "nj.init(); assert not nj.ffi_available()\n"
        "f = jax.jit(lambda t: nj.allreduce(t, op=nj.Sum))\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    out = f({'a': jnp.arange(3.0)}); g = jax.jit(lambda t: nj.allgather(t))(jnp.ones(2))\n"
        "assert np.array_equal(out['a'], np.arange(3.0)) and g.shape == (2,)\n"
        "assert 'nezha_collective' not in f.lower({'a': jnp.arange(3.0)}).as_text()\n"
        "msgs = [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)]\n"
        "assert len(msgs) == 1 and 'io_callback' in msgs[0], msgs\n"
        "print('OK')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEZHA_")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=90)
    assert out.returncode == 0 and "OK" in out.stdout, out.stdout + out.stderr
