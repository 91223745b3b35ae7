"""The multi-rail engine on the network-namespace testbed (root only; skips elsewhere)."""
import os
import re
import subprocess
import sys
import threading
import time

import pytest

from conftest import REPO, WORKERS, run_job, run_worker
from nezha.testbed.pytest_fixtures import testbed_factory  # noqa: F401 (fixture)

pytestmark = pytest.mark.testbed


def run_on(tb, script, *args, timeout=180):
    return run_worker(len(tb.hosts), script, *args, timeout=timeout,
                      nezharun_args=tb.nezharun_args())


@pytest.mark.parametrize("rates", [["1gbit", "1gbit"], ["1gbit", "250mbit"],
                                   ["1gbit", "500mbit", "250mbit"]])
def test_striped_allreduce_is_correct_and_bit_identical(testbed_factory, rates):
    tb = testbed_factory(hosts=4 if len(rates) == 2 else 3, rails=len(rates), rates=rates)
    result = run_on(tb, "multirail_check.py", "correctness")
    assert result.returncode == 0, result.output[-4000:]
    for r in range(len(tb.hosts)):
        assert f"OK rank {r}" in result.lines(r), result.output[-3000:]


def test_split_follows_a_rate_change_within_two_seconds(testbed_factory):
    tb = testbed_factory(hosts=4, rails=2, rates=["1gbit", "1gbit"])
    result = run_on(tb, "multirail_check.py", "adapt", tb.prefix, "1", "250mbit")
    assert result.returncode == 0, result.output[-4000:]
    adapted = [float(m.group(1)) for l in result.lines(0) if (m := re.match(r"ADAPTED (\S+)", l))]
    assert adapted and adapted[0] <= 2.0, result.output[-3000:]


# Rail 0 also carries a path of the control channel; "reset" kills the host's connections on the rail.
@pytest.mark.parametrize("rail,fault", [(1, "cut"), (0, "cut"), (0, "reset")])
def test_failed_rail_fails_over_without_loss_and_is_readmitted(testbed_factory, rail, fault):
    """One host loses a rail during continuous 4 MiB allreduces."""
    from nezha.bench.failover_drill import run_drill

    tb = testbed_factory(hosts=4, rails=2, rates=["1gbit", "1gbit"])
    r = run_drill(tb, cycles=1, rail=rail, fault=fault, down_s=3.0, up_s=7.0)
    assert r["returncode"] == 0, r["output"][-4000:]  # every result was checked exactly by numpy
    assert sorted(r["reports"]) == [0, 1, 2, 3], r["output"][-3000:]
    for rank, rep in r["reports"].items():
        states = [s for _, s in rep["transitions"]]
        assert states and states[0] == "down" and states[-1] == "up", (rank, rep["transitions"])
        warnings = [l for l in r["output"].splitlines()
                    if l.startswith(f"[{rank}]<stderr>") and "continuing on" in l]
        assert len(warnings) == 1, warnings  # the one line a user sees
        if fault == "cut":  # noticed by the cut host's carrier, not after a silence limit
            assert "has no carrier" in warnings[0], warnings
    (cycle,) = r["cycles"]
    # Targets: stall <= 200 ms, re-admission <= 5 s; generous bounds for a loaded 2-core machine.
    assert cycle["stall_s"] <= 1.0, cycle
    assert cycle["readmit_s"] <= 8.0, cycle


@pytest.mark.parametrize("op", ["broadcast", "allgather", "reducescatter", "alltoall"])
def test_a_cut_during_striped_collectives_fails_over_without_loss(testbed_factory, op):
    """Every striped collective keeps allreduce's failover guarantees. A host loses
    rail 0 during back-to-back operations of 4 MiB per rank, striped over both rails (all but the
    alltoall balanced: a non-leader waits for its claims on the rail that is cut); every result is
    checked by numpy, the rail fails over on every rank and is re-admitted."""
    from nezha.bench.failover_drill import run_drill

    tb = testbed_factory(hosts=4, rails=2, rates=["1gbit", "1gbit"])
    r = run_drill(tb, cycles=1, rail=0, down_s=2.0, up_s=5.0, op=op)
    assert r["returncode"] == 0, r["output"][-4000:]
    assert sorted(r["reports"]) == [0, 1, 2, 3], r["output"][-3000:]
    for rank, rep in r["reports"].items():
        states = [s for _, s in rep["transitions"]]
        assert states and states[0] == "down" and states[-1] == "up", (rank, rep["transitions"])
    (cycle,) = r["cycles"]
    # Not frozen until the cable came back (2 s): a generous bound for a loaded 2-core machine.
    assert cycle["stall_s"] <= 1.0, cycle
    assert cycle["readmit_s"] <= 8.0, cycle


def run_with_a_cut(tb, worker_args, rail, host, after_s, cut_s, env=None, timeout=180, slots_per_host=1):
    """Runs tests/workers/<worker_args> on every host of `tb` (`slots_per_host` ranks each) and cuts
    `rail` of `host` for `cut_s` seconds, `after_s` after every rank printed READY; returns (exit
    code, output)."""
    n = len(tb.hosts) * slots_per_host
    cmd = [sys.executable, "-m", "nezha.runner.launch", "-np", str(n), *tb.nezharun_args(slots_per_host), "--",
           sys.executable, str(WORKERS / worker_args[0]), *worker_args[1:]]
    env = dict(os.environ, NEZHA_TIMEOUT_S="30", **(env or {}))
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while sum("READY" in l for l in lines) < n and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        time.sleep(after_s)
        tb.set_link(rail, False, host)
        time.sleep(cut_s)
        tb.set_link(rail, True, host)
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(timeout=10)
    return proc.returncode, "".join(lines)


def test_mixed_operations_survive_a_rail_cut(testbed_factory):
    """Small collectives done by rank 0 within negotiation, fused allreduces, broadcasts and allgathers
    on the rails and a striped 4 MiB allreduce per round, all in flight together while one host loses
    rail 0 (which also carries a control path) for 2 s: the cut is noticed whatever runs on the rail
    at that moment, the rail fails over, every result is exact and the job goes on."""
    tb = testbed_factory(hosts=4, rails=2, rates=["1gbit", "1gbit"])
    # 1 s is well inside the ~15 s of bursts; the 4 MiB ones use rail 0 every round.
    code, output = run_with_a_cut(tb, ["mixed_bursts.py", "120", "big"], rail=0, host=tb.hosts[1],
                                  after_s=1.0, cut_s=2.0)
    assert code == 0, output[-4000:]
    for r in range(4):
        assert f"[{r}]<stdout>: OK rank {r}: 1320 operations" in output, output[-3000:]
    assert "continuing on" in output, output[-3000:]  # the cut hit the run: a rail failed over


def test_dropped_handles_survive_a_rail_cut(testbed_factory):
    """Operations whose handles were dropped are failed over and redone like any other: a redo reads
    and writes buffers nobody but the engine holds any more."""
    tb = testbed_factory(hosts=4, rails=2, rates=["1gbit", "1gbit"])
    code, output = run_with_a_cut(tb, ["dropped_handles.py", "numpy", "1400"], rail=0,
                                  host=tb.hosts[2], after_s=0.5, cut_s=1.5,
                                  env={"NEZHA_FUSION_THRESHOLD": str(1 << 20)})
    assert code == 0, output[-4000:]
    for r in range(4):
        assert f"[{r}]<stdout>: OK rank {r}: 1400 operations" in output, output[-3000:]
    assert "continuing on" in output, output[-3000:]


def test_sixteen_ranks_broadcast_and_alltoall_on_slow_rails_without_false_alarms(testbed_factory):
    """16 ranks on 250 Mbit/s rails. A binomial tree kept ranks far from the root silent for ~300 ms
    (1 MiB pieces, every ancestor serving all its children through one link), and healthy rails failed
    over on every run; large broadcasts now go down a chain in smaller pieces. The 16 MB alltoall's
    pairwise steps overlapped in each sender's queue, which dropped, and TCP's retransmission timeouts
    failed healthy rails over in every run; a large step now waits for the last one's receipt. Each
    result checked."""
    tb = testbed_factory(hosts=16, rails=2, rates=["250mbit", "250mbit"])
    for op, sizes in (("broadcast", "1M,4M"), ("alltoall", "1M,16M")):
        bench = [sys.executable, "-m", "nezha.bench", "--op", op, "--sizes", sizes, "--iters", "3", "--warmup", "1"]
        result = run_job(16, bench, nezharun_args=tb.nezharun_args(), timeout=240)
        assert result.returncode == 0, (op, result.output[-4000:])
        assert "continuing on" not in result.output, (op, result.output[-4000:])
