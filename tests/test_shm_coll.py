"""The shared-memory collective rail (kind shmcoll) in real jobs through nezharun: allreduces of
several dtypes and ops against numpy, bit-identical on every rank, the bytes on the rail; broadcasts,
allgathers, reducescatters and alltoalls against numpy, run on the rail (its counters, exactly) alone and with
the default rails; every collective against numpy with it beside the p2p shm rail; the default rails
of a one-host job; a rank SIGKILLed named on the others, in an allreduce and in the other
operations; nothing left in /dev/shm."""
import pytest
import os
import signal
import sys

from conftest import assert_victim_named, launch_direct, run_job

TIMEOUT_S = 4


def test_allreduces_over_shmcoll_alone_match_numpy(job):
    # shm_coll_check runs only allreduces (and allgathers of digests, small enough for negotiation).
    result = job(4, "shm_coll_check.py", "expect_all_on_shmcoll",
                 env={"NEZHA_RAILS": "shmcoll", "NEZHA_AUTO_SHM": "0"}, timeout=300)
    assert result.returncode == 0, result.output[-4000:]
    for r in range(4):
        assert any(l.startswith(f"OK rank {r}:") for l in result.lines(r)), result.output[-4000:]


@pytest.mark.parametrize("rails", [{"NEZHA_RAILS": "shmcoll", "NEZHA_AUTO_SHM": "0"}, {}],
                         ids=["shmcoll-alone", "default-rails"])
def test_broadcast_allgather_reducescatter_and_alltoall_run_on_shmcoll_and_match_numpy(job, rails):
    # shm_coll_ops_check asserts each operation moved exactly its bytes on shmcoll and none elsewhere.
    result = job(4, "shm_coll_ops_check.py", env=rails, timeout=300)
    assert result.returncode == 0, result.output[-4000:]
    for r in range(4):
        assert any(l.startswith(f"OK rank {r}: 11 operations on shmcoll") for l in result.lines(r)), \
            result.output[-4000:]


def test_every_collective_with_shmcoll_beside_shm_matches_numpy(job):
    result = job(4, "collectives_check.py", env={"NEZHA_RAILS": "shm,shmcoll"}, timeout=300)
    assert result.returncode == 0, result.output[-4000:]
    for r in range(4):
        assert any(l.startswith(f"OK rank {r}:") for l in result.lines(r)), result.output[-4000:]


def assert_rail_kinds(ranks, want, env=None):
    """Every rank of a plain one-host job of `ranks` ranks reports the rail kinds `want`."""
    code = ("import nezha; nezha.init(); "
            "print('KINDS', sorted(s['kind'] for s in nezha.rail_stats()))")
    result = run_job(ranks, [sys.executable, "-c", code], env=env or {}, timeout=60 + 10 * ranks)
    assert result.returncode == 0, result.output[-2000:]
    for r in range(ranks):
        assert f"KINDS {sorted(want)}" in "\n".join(result.lines(r)), result.output[-2000:]


def test_a_one_host_job_gets_shmcoll_by_default_and_the_knob_turns_it_off():
    assert_rail_kinds(2, ["shmcoll", "tcp+shm"])
    assert_rail_kinds(2, ["tcp+shm"], env={"NEZHA_AUTO_SHM_COLL": "0"})


def test_a_one_host_job_of_more_than_eight_ranks_gets_no_automatic_shmcoll():
    # Past 8 ranks on the host the collective rail's start-up and its large allreduces cost more
    # than it gains (nezha/basics.py _AUTO_SHM_COLL_MAX_RANKS): the ring alone, unless listed.
    assert_rail_kinds(9, ["tcp+shm"])


def test_allreduces_with_the_automatic_shmcoll_match_numpy(job):
    # The default rails: the large allreduces must reach shmcoll (expect_large_on_shmcoll).
    result = job(4, "shm_coll_check.py", "expect_large_on_shmcoll", timeout=300)
    assert result.returncode == 0, result.output[-4000:]
    for r in range(4):
        assert any(l.startswith(f"OK rank {r}:") for l in result.lines(r)), result.output[-4000:]


def test_killed_rank_is_named_on_every_other_rank():
    victim, survivors = 1, [0, 2]
    results = launch_direct(3, "dead_peer.py", "kill", str(victim),
                            env={"NEZHA_RAILS": "shmcoll", "NEZHA_AUTO_SHM": "0",
                                 "NEZHA_TIMEOUT_S": str(TIMEOUT_S)},
                            timeout=TIMEOUT_S + 20, wait_for=survivors)
    assert_victim_named(results, victim, survivors, within_s=TIMEOUT_S)


def test_killed_rank_is_named_on_every_other_rank_with_the_default_rails():
    # lo with its shm lane beside shmcoll: no failover there (both fail only with a rank), so the
    # death fails the operation naming the rank, as with one rail.
    victim, survivors = 2, [0, 1]
    results = launch_direct(3, "dead_peer.py", "kill", str(victim), env={"NEZHA_TIMEOUT_S": str(TIMEOUT_S)},
                            timeout=TIMEOUT_S + 20, wait_for=survivors)
    assert_victim_named(results, victim, survivors, within_s=TIMEOUT_S)


@pytest.mark.parametrize("op", ["broadcast", "allgather", "reducescatter", "alltoall"])
def test_killed_rank_is_named_on_every_other_rank_in_the_other_operations(op):
    victim, survivors = 2, [0, 1]
    results = launch_direct(3, "dead_peer.py", "kill", str(victim), op, env={"NEZHA_TIMEOUT_S": str(TIMEOUT_S)},
                            timeout=TIMEOUT_S + 20, wait_for=survivors)
    assert_victim_named(results, victim, survivors, within_s=TIMEOUT_S)


def test_nothing_left_in_dev_shm_after_a_killed_job(job):
    before = set(os.listdir("/dev/shm"))
    result = job(3, "dead_peer.py", "kill", "2",
                 env={"NEZHA_RAILS": "shmcoll", "NEZHA_AUTO_SHM": "0", "NEZHA_TIMEOUT_S": str(TIMEOUT_S)},
                 timeout=90)
    assert result.returncode == 128 + signal.SIGKILL, result.output[-2000:]
    left = [n for n in set(os.listdir("/dev/shm")) - before if "nezha" in n]
    assert not left, left
