"""Mismatched metadata under one name fails loudly on every rank and leaves the engine usable."""
import pytest


@pytest.mark.parametrize("ranks", [2, 3])
def test_mismatch_raises_on_every_rank_and_engine_recovers(job, ranks):
    result = job(ranks, "mismatch.py", timeout=120)
    assert result.returncode == 0, result.output[-4000:]
    for r in range(ranks):
        assert f"OK rank {r}" in result.lines(r), result.output[-4000:]
        assert sum("raised in" in l for l in result.lines(r)) == 9
