"""Every collective across 2, 3 and 4 real processes on this machine, checked against numpy."""
import pytest


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_collectives_match_numpy_and_agree_bitwise(job, ranks):
    result = job(ranks, "collectives_check.py", timeout=300)
    assert result.returncode == 0, result.output[-4000:]
    for r in range(ranks):
        assert any(l.startswith(f"OK rank {r}:") for l in result.lines(r)), result.output[-4000:]


def test_multi_segment_ring_halving_and_logstep_everywhere(job):
    # Tiny segments reach the multi-segment paths; zero log-step and halving thresholds send even
    # one-element payloads through the ring, a huge halving one sends them all through
    # halving/doubling, and a huge log-step one sends 1 MiB through log-step (small allreduces
    # stay on the rail: none is reduced by rank 0 within negotiation).
    no_inline = {"NEZHA_CONTROL_INLINE_BYTES": "0"}
    for env in ({"NEZHA_SEGMENT_BYTES": "4096", "NEZHA_LOGSTEP_MAX_BYTES": "0", "NEZHA_HALVING_MAX_BYTES": "0", **no_inline},
                {"NEZHA_SEGMENT_BYTES": "4096", "NEZHA_LOGSTEP_MAX_BYTES": "0", "NEZHA_HALVING_MAX_BYTES": str(1 << 30),
                 **no_inline},
                {"NEZHA_LOGSTEP_MAX_BYTES": str(1 << 30), **no_inline}):
        result = job(3, "collectives_check.py", env=env, timeout=300)
        assert result.returncode == 0, (env, result.output[-4000:])


@pytest.mark.parametrize("script,args", [("collectives_check.py", ()), ("steady_allreduce.py", ("2",))])
def test_collectives_with_cache_rounds(job, script, args):
    # NEZHA_CACHE_ROUNDS=1: repeated (cached) allreduces are agreed among the ranks directly
    # instead of through rank 0; results must be the same, exact and in step on every rank.
    ranks = 3
    result = job(ranks, script, *args, env={"NEZHA_CACHE_ROUNDS": "1"}, timeout=300)
    assert result.returncode == 0, result.output[-4000:]
    for r in range(ranks):
        assert any(l.startswith(f"OK rank {r}") for l in result.lines(r)), result.output[-4000:]


@pytest.mark.parametrize("control_inline_bytes", ["16384", "0"])
def test_mixed_bursts_in_different_orders(job, control_inline_bytes):
    # Allreduces (some reduced by rank 0 within negotiation, some fused on the rails), grouped
    # allreduces, broadcasts and allgathers in flight together, in a different order on each rank.
    ranks = 3
    result = job(ranks, "mixed_bursts.py", "12",
                 env={"NEZHA_CONTROL_INLINE_BYTES": control_inline_bytes}, timeout=300)
    assert result.returncode == 0, result.output[-4000:]
    for r in range(ranks):
        assert any(l.startswith(f"OK rank {r}: 120 operations") for l in result.lines(r)), result.output[-4000:]


@pytest.mark.parametrize("ranks", [2, 3])
def test_prescale_and_postscale_give_horovods_bits(job, ranks):
    # Issue 16: Horovod scales float32 in float32 (the factor cast first), float16 in float32,
    # integers in float64 truncated; its tests compare exactly for 2-3 ranks, so must we.
    result = job(ranks, "scaling_check.py", timeout=120)
    assert result.returncode == 0, result.output[-4000:]
    for r in range(ranks):
        assert any(l.startswith(f"OK rank {r}:") for l in result.lines(r)), result.output[-4000:]


@pytest.mark.parametrize("lead", ["1", "0"])
def test_synchronous_calls_lead_the_engine_loop(job, lead):
    # A synchronous call runs the engine's loop itself while it waits (NEZHA_LEAD_US): every
    # collective still matches numpy, small and large, from three threads at once and with a late
    # peer; a worker's engine thread sleeps through 30 small calls, and wakes for each with 0.
    ranks = 3
    env = {} if lead == "1" else {"NEZHA_LEAD_US": "0"}
    result = job(ranks, "sync_lead.py", lead, env=env, timeout=300)
    assert result.returncode == 0, result.output[-4000:]
    for r in range(ranks):
        assert any(l.startswith(f"OK rank {r}:") for l in result.lines(r)), result.output[-4000:]


@pytest.mark.parametrize("ranks", [2, 4])
def test_synchronous_numpy_allreduce_matches_the_layered_path(job, ranks):
    # nezha.allreduce takes a direct path for plain numpy arrays (ops._allreduce_now): the same
    # bits as allreduce_async + wait, numpy's answer, and the other inputs still go the long way.
    result = job(ranks, "sync_allreduce_check.py", timeout=300)
    assert result.returncode == 0, result.output[-4000:]
    for r in range(ranks):
        assert any(l.startswith(f"OK rank {r}:") for l in result.lines(r)), result.output[-4000:]


@pytest.mark.parametrize("votes", ["1", "0"])
def test_small_allreduces_voted_on_the_host_board_match_rank_zeros(job, votes):
    # On one host a repeated small allreduce from a synchronous call is voted on the host board
    # (NEZHA_HOST_VOTE): every dtype and reduction gives rank 0's bits, on every rank, and numpy's
    # answer; with the knob off rank 0 does them all.
    ranks = 4
    result = job(ranks, "host_vote_check.py", votes, env={"NEZHA_HOST_VOTE": votes}, timeout=300)
    assert result.returncode == 0, result.output[-4000:]
    for r in range(ranks):
        assert any(l.startswith(f"OK rank {r}:") for l in result.lines(r)), result.output[-4000:]
