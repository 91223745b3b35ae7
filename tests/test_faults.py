"""A peer killed or stopped: every other rank fails loudly and promptly, naming it; nezharun stops
the job with a one-line reason."""
import re
import signal
import time

import pytest

from conftest import assert_victim_named, launch_direct

TIMEOUT_S = 4


# Rank 0 is the coordinator every other rank waits on for responses; rank 2 a plain peer.
@pytest.mark.parametrize("victim", [0, 2])
@pytest.mark.parametrize("how", ["kill", "stop"])
def test_dead_or_frozen_peer_is_named_on_every_other_rank(how, victim):
    survivors = [r for r in range(3) if r != victim]
    # The stopped victim never exits by itself: it is killed once the others have exited.
    results = launch_direct(3, "dead_peer.py", how, str(victim),
                            env={"NEZHA_TIMEOUT_S": str(TIMEOUT_S)}, timeout=TIMEOUT_S + 20,
                            wait_for=survivors)
    assert_victim_named(results, victim, survivors, within_s=TIMEOUT_S + 3)


# 8-byte allreduces of 4 ranks on one host: after their first time agreed and reduced by every rank on
# the host board (the survivors were waiting there when the victim went), else done by rank 0
# within negotiation; a killed or frozen rank is still named.
@pytest.mark.parametrize("victim", [0, 2])
@pytest.mark.parametrize("how", ["kill", "stop"])
@pytest.mark.parametrize("host_vote", ["1", "0"])
def test_a_lost_peer_is_named_in_small_allreduces_on_one_host(how, victim, host_vote):
    survivors = [r for r in range(4) if r != victim]
    results = launch_direct(4, "dead_peer.py", how, str(victim), "allreduce", "2",
                            env={"NEZHA_TIMEOUT_S": str(TIMEOUT_S), "NEZHA_HOST_VOTE": host_vote},
                            timeout=TIMEOUT_S + 20, wait_for=survivors)
    assert_victim_named(results, victim, survivors, within_s=TIMEOUT_S + 3)
    for rank in survivors:
        votes = int(re.search(r"HOST VOTES (\d+)", results[rank].output).group(1))
        assert (votes >= 10) == (host_vote == "1"), results[rank].output[-2000:]


def test_nezharun_stops_the_job_when_a_rank_dies(job):
    start = time.monotonic()
    result = job(3, "dead_peer.py", "kill", "1", env={"NEZHA_TIMEOUT_S": str(TIMEOUT_S)},
                 timeout=90)
    assert result.returncode == 128 + signal.SIGKILL, result.output[-2000:]
    assert time.monotonic() - start < 30
    reasons = [l for l in result.output.splitlines() if l.startswith("nezharun:")]
    assert len(reasons) == 1 and "rank 1" in reasons[0], result.output[-2000:]
