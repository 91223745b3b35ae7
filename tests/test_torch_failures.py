"""A case failing on some ranks leaves the job usable and in step, and every rank says which tensor
waits for which ranks, on 2 real ranks."""

import re
import time

import pytest

from torch_workers.harness import assert_every_rank_passed, run_workers

pytest.importorskip("torch")

EXPECTED = {"exception between collectives", "mismatched group", "optimizer after failures"}


@pytest.mark.timeout(120)
def test_failures_on_some_ranks_leave_the_job_in_step():
    started = time.monotonic()
    output = run_workers("w_failure.py", num_ranks=2, timeout_s=90,
                         env={"NEZHA_STALL_CHECK_S": "2", "NEZHA_STALL_SHUTDOWN_S": "4"})
    assert_every_rank_passed(output, 2, EXPECTED)
    # The stall was reported on both ranks, naming the tensor, who submitted it and who did not.
    for rank in range(2):
        pattern = (r"^\[%d\]<stderr>: .*stall: tensor 'allreduce\.after\.exception' was submitted "
                   r"by rank 0 \d+ s ago but rank 1 has not submitted it" % rank)
        assert re.search(pattern, output, re.M), "rank %d did not report the stall:\n%s" % (
            rank, output)
    assert time.monotonic() - started < 60, output
