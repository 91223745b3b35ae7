"""The framework-neutral layer under the adapters (object collectives, process sets, Horovod's
names, elastic state, gradient bookkeeping) on numpy only, across 2 and 3 real processes."""
import pytest

CHECKS = ["object collectives", "process sets and Horovod's names", "elastic state and sampler",
          "gradient bookkeeping"]


@pytest.mark.parametrize("ranks", [2, 3])
def test_neutral_layer_on_numpy(job, ranks):
    result = job(ranks, "neutral_layer.py", timeout=120)
    assert result.returncode == 0, result.output[-4000:]
    for r in range(ranks):
        for check in CHECKS:
            assert f"OK rank {r}: {check}" in result.lines(r), (r, check, result.output[-4000:])
