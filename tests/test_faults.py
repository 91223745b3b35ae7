"""A peer killed or stopped: the others fail loudly and promptly, nezharun stops the job."""
import re
import time

import pytest

TIMEOUT_S = 4


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_dead_or_frozen_peer_is_named_on_every_other_rank(job, how):
    start = time.monotonic()
    result = job(3, "dead_peer.py", how, "2", env={"NEZHA_TIMEOUT_S": str(TIMEOUT_S)}, timeout=90)
    elapsed = time.monotonic() - start
    assert result.returncode != 0, result.output
    assert elapsed < 60, f"job took {elapsed:.0f} s to stop"
    lines = [l for l in result.output.splitlines() if l.startswith("nezharun:")]
    assert len(lines) == 1 and "rank" in lines[0], result.output[-3000:]
    # nezharun stops the job as soon as the first rank exits, so at least one survivor reported.
    raised = [l for r in (0, 1) for l in result.lines(r) if l.startswith("RAISED")]
    assert raised, result.output[-3000:]
    for line in raised:
        seconds = float(re.search(r"after (\S+)s", line).group(1))
        assert seconds < TIMEOUT_S + 5, line
        assert "rank 2" in line, line
