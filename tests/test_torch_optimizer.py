"""DistributedOptimizer equals single-process training on the concatenated batch; replicas stay
bit-identical; broadcast helpers and SyncBatchNorm; on 2 and 3 real ranks."""

import pytest

from torch_workers.harness import assert_every_rank_passed, run_workers

pytest.importorskip("torch")

EXPECTED = {
    "DistributedOptimizer plain", "DistributedOptimizer backward_passes_per_step=2",
    "DistributedOptimizer groups=2", "DistributedOptimizer fp16",
    "DistributedOptimizer sparse gradients", "DistributedOptimizer sparse_as_dense",
    "GradScaler with synchronize/skip_synchronize",
    "broadcast_parameters and broadcast_optimizer_state", "SyncBatchNorm"}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("num_ranks", [2, 3])
def test_distributed_optimizer_matches_single_process(num_ranks):
    output = run_workers("w_optimizer.py", num_ranks=num_ranks, timeout_s=150)
    assert_every_rank_passed(output, num_ranks, EXPECTED)
