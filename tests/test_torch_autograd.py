"""Gradients of nezha.torch's synchronous collectives (Horovod's conventions), on 2 real ranks."""

import pytest

from torch_workers.harness import assert_every_rank_passed, run_workers

pytest.importorskip("torch")

EXPECTED = {"allreduce grad", "allgather grad", "broadcast grad", "alltoall grad",
            "reducescatter grad", "grouped_allreduce grad"}


@pytest.mark.timeout(120)
def test_sync_ops_are_differentiable():
    output = run_workers("w_autograd.py", num_ranks=2, timeout_s=100)
    assert_every_rank_passed(output, 2, EXPECTED)
