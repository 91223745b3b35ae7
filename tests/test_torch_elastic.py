"""hvd.elastic (Horovod's elastic API) on the fixed set of ranks nezharun starts, on 2 and 3 ranks."""

import pytest

from torch_workers.harness import assert_every_rank_passed, run_workers

pytest.importorskip("torch")

EXPECTED = {"sync, commit and restore", "failure restores the last commit",
            "ElasticSampler shards and resumes"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_ranks", [2, 3])
def test_elastic_api_on_a_fixed_world(num_ranks):
    output = run_workers("w_elastic.py", num_ranks=num_ranks, timeout_s=100)
    assert_every_rank_passed(output, num_ranks, EXPECTED)
