"""Operations own their buffers: dropped handles, failures and exits never crash, hang or leak."""
import pytest

from conftest import launch_direct

FUSION = {"NEZHA_FUSION_THRESHOLD": str(1 << 20)}  # sizes either side of it within a short run


def assert_ok(result, ranks):
    assert result.returncode == 0, result.output[-4000:]
    for r in range(ranks):
        assert any(l.startswith(f"OK rank {r}") for l in result.lines(r)), result.output[-4000:]


@pytest.mark.parametrize("api,ranks", [("numpy", 2), ("numpy", 4), ("buffers", 2), ("torch", 2),
                                       ("torch", 4)])
def test_dropped_handles_never_corrupt_memory(job, api, ranks):
    # Before the engine owned its buffers this died with SIGSEGV within a few hundred operations.
    result = job(ranks, "dropped_handles.py", api, "700", env=FUSION, timeout=300)
    assert_ok(result, ranks)


def test_dropped_handles_with_rank0_and_rail_paths_only(job):
    # Inline path off: the smallest sizes go through the rails' log-step too.
    result = job(2, "dropped_handles.py", "numpy", "350",
                 env={**FUSION, "NEZHA_CONTROL_INLINE_BYTES": "0"}, timeout=300)
    assert_ok(result, 2)


def test_lifetime_edges_end_in_clear_errors_and_the_job_goes_on(job):
    result = job(2, "lifetime_edges.py", "edges", timeout=200)
    assert_ok(result, 2)
    for r in range(2):
        assert any("mismatch raised: tensor 'mismatch.kept'" in l for l in result.lines(r))


def test_exit_without_shutdown_with_operations_in_flight_is_clean(job):
    result = job(2, "lifetime_edges.py", "exit", timeout=120)
    assert_ok(result, 2)
    assert "Fatal Python error" not in result.output and "SIG" not in result.output


def test_dead_peer_fails_dropped_operations_and_names_the_rank():
    survivor, victim = launch_direct(2, "lifetime_edges.py", "deadpeer",
                                     env={"NEZHA_TIMEOUT_S": "5"}, timeout=120)
    assert victim.returncode == 3, victim.output[-2000:]
    assert survivor.returncode == 0, survivor.output[-4000:]
    assert "OK rank 0: raised after" in survivor.output, survivor.output[-4000:]


def test_long_life_of_mixed_operations_leaves_nothing_behind(job):
    # Every collective, dtype and size class, sync, async and dropped, with failures on purpose; the
    # worker checks every observed result against numpy and, after shutdown(), that no native
    # thread, socket or buffer of the engine is left.
    result = job(2, "long_life.py", "3000", env={"NEZHA_FUSION_THRESHOLD": str(256 << 10)},
                 timeout=600)
    assert_ok(result, 2)
