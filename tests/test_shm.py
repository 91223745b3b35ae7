"""The shared-memory rail under real jobs on this machine (NEZHA_RAILS=shm): every op x dtype
against numpy over shm with 3 and 4 ranks, the data really on shm, a rank SIGKILLed mid-operation
named on every other rank within NEZHA_TIMEOUT_S, and nothing left in /dev/shm after a killed job."""
import os
import signal

import pytest

import sys

from conftest import assert_victim_named, launch_direct, run_job

# The p2p shm rail alone: the automatic collective rail (test_shm_coll.py) would take allreduce shares.
SHM = {"NEZHA_RAILS": "shm", "NEZHA_AUTO_SHM_COLL": "0"}
TIMEOUT_S = 4


@pytest.mark.parametrize("ranks", [3, 4])
def test_every_op_and_dtype_over_shm_matches_numpy(job, ranks):
    result = job(ranks, "collectives_check.py", env=SHM, timeout=300)
    assert result.returncode == 0, result.output[-4000:]
    for r in range(ranks):
        assert any(l.startswith(f"OK rank {r}:") for l in result.lines(r)), result.output[-4000:]


def test_the_data_goes_over_shm(job):
    result = job(3, "shm_traffic.py", env=SHM, timeout=120)
    assert result.returncode == 0, result.output[-4000:]
    for r in range(3):
        assert any(l.startswith(f"OK rank {r}:") for l in result.lines(r)), result.output[-4000:]


def test_killed_rank_is_named_on_every_other_rank():
    victim, survivors = 1, [0, 2]
    results = launch_direct(3, "dead_peer.py", "kill", str(victim),
                            env={**SHM, "NEZHA_TIMEOUT_S": str(TIMEOUT_S)}, timeout=TIMEOUT_S + 20,
                            wait_for=survivors)
    assert_victim_named(results, victim, survivors, within_s=TIMEOUT_S)


def test_nothing_left_in_dev_shm_after_a_killed_job(job):
    before = set(os.listdir("/dev/shm"))
    result = job(3, "dead_peer.py", "kill", "2", env={**SHM, "NEZHA_TIMEOUT_S": str(TIMEOUT_S)},
                 timeout=90)
    assert result.returncode == 128 + signal.SIGKILL, result.output[-2000:]
    # Segments are memfds (core/tests/transport/shm_rail_process_test.cc checks the mappings);
    # no file of ours may appear, whatever other processes on the machine do meanwhile.
    left = [n for n in set(os.listdir("/dev/shm")) - before if "nezha" in n]
    assert not left, left


def test_a_one_host_job_uses_shm_by_default(job):
    """No rails given, every rank on this host: the default TCP rail gets the automatic shm lane,
    which carries the allreduces (every dtype x op against numpy, bit-identical; the bytes checked
    to go through shared memory). The automatic collective rail is off here: it would take shares
    of the allreduces (test_shm_coll.py)."""
    result = job(3, "hierarchical_check.py", env={"NEZHA_AUTO_SHM_COLL": "0"}, timeout=300)
    assert result.returncode == 0, result.output[-4000:]
    for r in range(3):
        assert any(l.startswith(f"OK rank {r}:") for l in result.lines(r)), result.output[-4000:]


def test_the_automatic_shm_knob_turns_it_off():
    code = ("import nezha; nezha.init(); "
            "print('KINDS', [s['kind'] for s in nezha.rail_stats()])")
    result = run_job(2, [sys.executable, "-c", code], env={"NEZHA_AUTO_SHM": "0"}, timeout=60)
    assert result.returncode == 0, result.output[-2000:]
    for r in range(2):
        assert "KINDS ['tcp']" in "\n".join(result.lines(r)), result.output[-2000:]
