"""Horovod's torch semantics scripts and test suites rely on (issue 16), on 2 and 3 real ranks."""

import pytest

from torch_workers.harness import assert_every_rank_passed, run_workers

pytest.importorskip("torch")

EXPECTED = {"HOROVOD_* environment", "int16", "prescale and postscale", "grouped_reducescatter",
            "reducescatter gradients", "other gradients",
            "broadcast_optimizer_state without gradients", "SparseAdam with sparse gradients",
            "API forms"}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("num_ranks", [2, 3])
def test_horovod_semantics(num_ranks):
    output = run_workers("w_horovod.py", num_ranks=num_ranks, timeout_s=200)
    assert_every_rank_passed(output, num_ranks, EXPECTED)
