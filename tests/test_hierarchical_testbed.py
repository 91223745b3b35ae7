"""Hierarchical allreduce on the network-namespace testbed (root only; skips elsewhere): 2 hosts x
2 ranks and the uneven 3 + 1, each host's ranks sharing memory (shm is added by itself), the slices
crossing hosts over two shaped rails; results against numpy, bit-identical; a rank killed
mid-operation is named on every other rank within NEZHA_TIMEOUT_S; nothing left in /dev/shm."""
import os

import pytest

from conftest import assert_victim_named, launch_direct, run_worker
from test_multirail_testbed import run_with_a_cut
from nezha.testbed.pytest_fixtures import testbed_factory  # noqa: F401 (fixture)

pytestmark = pytest.mark.testbed
TIMEOUT_S = 6


def placed_args(tb, slots):
    """nezharun arguments for the testbed with `slots[i]` ranks on host i."""
    args = tb.nezharun_args()
    args[args.index("-H") + 1] = ",".join(f"{h}:{n}" for h, n in zip(tb.hosts, slots))
    return args


@pytest.mark.parametrize("slots", [(2, 2), (3, 1)])
def test_hierarchical_allreduce_matches_numpy_on_every_rank(testbed_factory, slots):
    tb = testbed_factory(hosts=2, rails=2, rates=["1gbit", "1gbit"])
    result = run_worker(sum(slots), "hierarchical_check.py", nezharun_args=placed_args(tb, slots),
                        timeout=400)
    assert result.returncode == 0, result.output[-4000:]
    for r in range(sum(slots)):
        assert any(l.startswith(f"OK rank {r}:") for l in result.lines(r)), result.output[-4000:]


def test_killed_rank_is_named_on_every_other_rank_and_no_segment_is_left(testbed_factory):
    tb = testbed_factory(hosts=2, rails=2, rates=["1gbit", "1gbit"])
    hosts = [tb.hosts[0], tb.hosts[0], tb.hosts[1], tb.hosts[1]]
    victim, survivors = 1, [0, 2, 3]  # its host peer sees it on shm, the others on the network
    before = set(os.listdir("/dev/shm"))
    results = launch_direct(4, "dead_peer.py", "kill", str(victim), hosts=hosts,
                            rendezvous_addr=tb.rendezvous_addr,
                            env={"NEZHA_RAILS": ",".join(tb.rail_subnets),
                                 "NEZHA_TIMEOUT_S": str(TIMEOUT_S)},
                            timeout=TIMEOUT_S + 60, wait_for=survivors)
    assert_victim_named(results, victim, survivors, within_s=TIMEOUT_S)
    left = [n for n in set(os.listdir("/dev/shm")) - before if "nezha" in n]
    assert not left, left


def test_a_rail_cut_under_hierarchical_allreduces_fails_over_with_exact_results(testbed_factory):
    """2 hosts x 2 ranks, collectives of every kind in flight (the 4 MiB allreduces hierarchical)
    while host 1 loses rail 0 for 2 s: the rail fails over, every result is exact (checked by the
    worker against numpy) and the job goes on."""
    tb = testbed_factory(hosts=2, rails=2, rates=["1gbit", "1gbit"])
    code, output = run_with_a_cut(tb, ["mixed_bursts.py", "120", "big"], rail=0, host=tb.hosts[1],
                                  after_s=1.0, cut_s=2.0, slots_per_host=2)
    assert code == 0, output[-4000:]
    for r in range(4):
        assert f"[{r}]<stdout>: OK rank {r}:" in output, output[-3000:]
    assert "continuing on" in output, output[-3000:]  # the cut hit the run: a rail failed over
