"""nezha.torch with process sets (the even and the odd ranks), as Horovod's tests use them, on 2
ranks (sets of one) and 4 (sets of two): every collective, gradients, DistributedOptimizer, errors."""

import pytest

from torch_workers.harness import assert_every_rank_passed, run_workers

pytest.importorskip("torch")

EXPECTED = {"allreduce", "allgather broadcast alltoall reducescatter", "gradients",
            "DistributedOptimizer", "DistributedOptimizer outside its set", "errors", "removal"}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("ranks", [2, 4])
def test_torch_process_sets(ranks):
    output = run_workers("w_process_sets.py", num_ranks=ranks, timeout_s=200)
    assert_every_rank_passed(output, ranks, EXPECTED)
