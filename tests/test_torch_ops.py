"""nezha.torch collectives, each op x dtype against a torch reference, on 2 real ranks."""

import pytest

from torch_workers.harness import assert_every_rank_passed, run_workers

pytest.importorskip("torch")

EXPECTED = {"allreduce %s" % d for d in ("torch.float16", "torch.bfloat16", "torch.float32",
                                         "torch.float64", "torch.uint8", "torch.int8",
                                         "torch.int32", "torch.int64")} | {
    "allreduce bool", "allreduce variants", "grouped_allreduce", "allgather", "broadcast",
    "alltoall", "reducescatter", "sparse allreduce", "objects and barrier", "errors"}


@pytest.mark.timeout(180)
def test_collectives_match_torch_reference_on_every_rank():
    output = run_workers("w_ops.py", num_ranks=2, timeout_s=150)
    assert_every_rank_passed(output, 2, EXPECTED)
