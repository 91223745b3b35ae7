"""nezha.sim: the engine's planner objects through nezha._core.planner, the step schedules against
closed forms, a simulated job's striping, balancing and failover, the training step, the CLI."""
import json
import math
import subprocess
import sys

import numpy as np
import pytest

from nezha._core import planner
from nezha.sim import Cluster, SimJob, load_profile, parse_rails
from nezha.sim import schedules
from nezha.sim import train as sim_train
from nezha.sim.cluster import parse_rate_gbps

MB = 1 << 20


def test_rates_parse_like_tc():
    assert parse_rate_gbps("1gbit") == 1.0
    assert parse_rate_gbps("250mbit") == pytest.approx(0.25)
    assert parse_rate_gbps("100g") == 100.0
    with pytest.raises(ValueError, match="rate 'fast'"):
        parse_rate_gbps("fast")
    rails = parse_rails("ofi:100gbit,250mbit,agg:10gbit")
    assert [(r.kind, r.gbps) for r in rails] == [("ofi", 100.0), ("tcp", 0.25), ("agg", 10.0)]
    assert not rails[2].point_to_point
    with pytest.raises(ValueError, match="kind 'ib'"):
        parse_rails("ib:100gbit")


def _known_table(betas_gbps, alpha_us=100.0):
    table = planner.RailTable([dict(name=f"r{i}") for i in range(len(betas_gbps))])
    for rail, beta in enumerate(betas_gbps):
        for nbytes in planner.calibration_bytes():
            table.observe(rail, nbytes, alpha_us * 1e-6 + nbytes * 8 / (beta * 1e9))
    return table


def test_rail_table_is_cold_until_measured_then_water_fills():
    table = planner.RailTable([dict(name="a"), dict(name="b")])
    cold = table.plan(1 << 22, 4)
    assert not cold.striped and cold.why.startswith("cold")
    table = _known_table([1.0, 0.25])
    plan = table.plan(1 << 24, 4)
    assert plan.striped
    counts = np.array([s.count for s in plan.shares], dtype=float)
    assert counts.sum() == 1 << 24
    # Water filling with equal alphas: shares in proportion to the rates (4:1), within alignment.
    assert counts[0] / counts.sum() == pytest.approx(0.8, abs=0.01)
    table.set_state(1, "down")
    assert table.usable() == [True, False]
    down = table.plan(1 << 24, 4)
    assert [s.rail for s in down.shares] == [0]
    with pytest.raises(ValueError, match="up, down or probing"):
        table.set_state(0, "sideways")


def test_share_balancer_hands_out_every_element_once():
    rng = np.random.default_rng(7)
    table = _known_table([1.0, 0.5, 0.25])
    total = 3 << 22
    plan = table.plan(total, 4)
    assert len(plan.shares) == 3
    balancer = planner.ShareBalancer(plan.shares, 1 << 18, 1024, 1 << 15)
    seen = np.zeros(total, dtype=np.int32)
    clocks = [0.0, 0.0, 0.0]
    live = {0, 1, 2}
    while live:
        part = min(live, key=lambda p: clocks[p])
        offset, count = balancer.claim(part, clocks[part])
        if count == 0:
            live.discard(part)
            continue
        seen[offset:offset + count] += 1
        clocks[part] += count / (1e8 * (0.5 ** part)) * rng.uniform(0.8, 1.2)
    assert (seen == 1).all()
    with pytest.raises(ValueError, match="no part 5"):
        balancer.claim(5, 1.0)


def test_rail_health_backs_off_on_failed_probes():
    h = planner.RailHealth("r1", initial_backoff_ms=500)
    h.mark_failed(10.0)
    assert h.state == "down" and not h.probe_due(10.4) and h.probe_due(10.5)
    h.begin_probe(10.5)
    h.probe_failed(10.5)
    assert h.next_probe_at_s == pytest.approx(11.5)  # doubled to 1 s
    h.begin_probe(11.5)
    h.probe_succeeded(11.5)
    assert h.state == "up"
    with pytest.raises(ValueError, match="finite"):
        h.mark_failed(float("nan"))


def test_ring_matches_its_closed_form_and_the_bucket_its_rate():
    rate, step = 125e6, 50e-6
    link = schedules.Link(rate, step, 1e12)
    n, nbytes = 8, 64 * MB
    expect = 2 * (n - 1) * (step + nbytes / n / rate)
    assert schedules.ring_allreduce(nbytes, n, link, 0.0) == pytest.approx(expect, rel=1e-3)
    # A token bucket: a burst after idle goes at line speed, a sustained stream at the rate.
    bucket = schedules.Link(rate, 0.0, 1e12, burst=512 * 1024, line=10 * rate)
    assert bucket.send(256 * 1024, 1.0) == pytest.approx(256 * 1024 / (10 * rate))
    t, sent = 2.0, 0
    for _ in range(200):
        t += bucket.send(1 * MB, t)
        sent += MB
    assert sent / (t - 2.0) == pytest.approx(rate, rel=0.02)


def test_logstep_steps_for_odd_sizes():
    link = schedules.Link(1e9, 10e-6, 1e12)
    assert schedules.logstep_allreduce(1024, 8, link, 0.0) == pytest.approx(3 * (10e-6 + 1024 / 1e9), rel=1e-3)
    assert schedules.logstep_allreduce(1024, 6, link, 0.0) == pytest.approx(4 * (10e-6 + 1024 / 1e9), rel=1e-3)


def test_the_fold_in_is_sent_by_the_idle_extra_hosts_so_a_stream_costs_the_busiest_links_bytes():
    # A shaped link (token bucket): the fold in goes out of the extra ranks' full buckets at line
    # speed and leaves this link's to refill, so a stream of 6-rank log-steps sends 3 x 64 KB per op
    # through the busiest host's link (2 doublings and the copy back), as 8 ranks' 3 doublings do.
    rate, line = 125e6, 20 * 125e6

    def stream(n):
        link = schedules.Link(rate, 0.0, 1e12, burst=512 * 1024, line=line)
        t = 0.0
        for _ in range(400):
            t += schedules.logstep_allreduce(64 * 1024, n, link, t)
        return t / 400

    assert stream(6) == pytest.approx(3 * 64 * 1024 / rate, rel=0.05)
    assert stream(6) == pytest.approx(stream(8), rel=0.05)
    # Its fold-in step alone: the extra host's burst at line speed, this link's tokens untouched.
    link = schedules.Link(rate, 10e-6, 1e12, burst=512 * 1024, line=line)
    before = link.tokens
    assert link.step_from_idle_host(64 * 1024) == pytest.approx(10e-6 + 64 * 1024 / line)
    assert link.tokens == before


def test_halving_moves_the_rings_bytes_in_log_steps():
    link = schedules.Link(1e9, 10e-6, 1e12)
    n_bytes = 8192
    # 8 ranks: 3 halving steps (4096, 2048, 1024 bytes) and 3 doubling steps back.
    want = 6 * 10e-6 + 2 * (4096 + 2048 + 1024) / 1e9
    assert schedules.halving_allreduce(n_bytes, 8, link, 0.0) == pytest.approx(want, rel=1e-3)
    # 6 ranks: 2 ranks fold in and out, two more steps of the whole buffer around p = 4.
    want = 6 * 10e-6 + 2 * (4096 + 2048 + n_bytes) / 1e9
    assert schedules.halving_allreduce(n_bytes, 6, link, 0.0) == pytest.approx(want, rel=1e-3)
    # allreduce.cc's rule: log-step, then halving up to its bound, then the ring.
    assert schedules.allreduce(n_bytes, 8, link, 0.0, 4096, halving_max_bytes=n_bytes) == \
        pytest.approx(schedules.halving_allreduce(n_bytes, 8, link, 0.0))
    assert schedules.allreduce(n_bytes, 8, link, 0.0, 4096, halving_max_bytes=4096) == \
        pytest.approx(schedules.ring_allreduce(n_bytes, 8, link, 0.0))


def _job(rails, hosts=4, profile="testbed"):
    return SimJob(Cluster(hosts, 1, parse_rails(rails)), load_profile(profile))


def test_striping_adds_the_rails_and_small_ops_travel_inline():
    one = _job("1gbit").allreduce(64 * MB).seconds
    job = _job("1gbit,1gbit")
    two = [job.allreduce(64 * MB) for _ in range(3)][-1]
    assert two.seconds == pytest.approx(one / 2, rel=0.05)
    assert set(two.shares) == {0, 1}
    uneven = _job("1gbit,250mbit")
    t = [uneven.allreduce(64 * MB).seconds for _ in range(3)][-1]
    assert one / t == pytest.approx(1.25, rel=0.05)
    small = job.allreduce(8)
    assert small.plan == "inline with negotiation" and small.seconds == pytest.approx(job.negotiation_seconds(8))


def test_a_cut_rail_fails_over_and_comes_back_after_probing():
    job = _job("1gbit,1gbit")
    t0 = job.now
    job.cut(1, t0 + 0.5, t0 + 2.0)
    results = []
    while job.now - t0 < 4.0:
        results.append((job.now - t0, job.allreduce(16 * MB)))
    failed = [r for _, r in results if r.failed_rails]
    assert len(failed) == 1 and failed[0].failed_rails == (1,)
    total = sum(failed[0].shares.values())
    assert total >= 16 * MB  # nothing lost: the cut range was redone on rail 0
    during = [r for t, r in results if 0.6 < t < 1.9]
    assert during and all(set(r.shares) == {0} for r in during)
    after = [r for t, r in results if t > 3.0]
    assert after and all(set(r.shares) == {0, 1} for r in after)
    assert any("back up" in what for _, what in job.events)


def test_training_step_is_compute_plus_the_exposed_allreduce():
    torch = pytest.importorskip("torch")
    # The simulator's mlp46m is examples/pytorch_synthetic_benchmark.py's: count torch's parameters.
    layers = [torch.nn.Linear(6144, 4096), torch.nn.Linear(4096, 4096), torch.nn.Linear(4096, 1000)]
    params = sum(p.numel() for layer in layers for p in layer.parameters())
    spec = sim_train.model("mlp46m")
    assert spec.gradient_bytes == 4 * params
    job = _job("1gbit,1gbit")
    compute = 0.3
    step = sim_train.step(job, spec, compute)
    alone = _job("1gbit,1gbit").allreduce(spec.gradient_bytes).seconds
    assert compute < step < compute + alone * 1.2
    fast = SimJob(Cluster(4, 1, parse_rails("1000gbit")), load_profile("cluster"))
    assert sim_train.step(fast, spec, compute) == pytest.approx(compute, rel=0.05)


def test_cli_writes_records_and_rejects_bad_rails(tmp_path):
    out = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "nezha.sim", "allreduce", "--hosts", "8", "--rails", "1gbit,250mbit",
           "--sizes", "1M,64M", "--json", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    records = json.loads(out.read_text())
    assert [r["bytes"] for r in records] == [MB, 64 * MB]
    for r in records:
        assert r["time_us"] > 0 and math.isfinite(r["busbw_gbps"])
    assert records[1]["busbw_gbps"] == pytest.approx(1.25 * 0.956, rel=0.1)
    bad = subprocess.run(cmd[:6] + ["--rails", "ib:1gbit"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "kind 'ib'" in bad.stderr


def test_a_shared_machine_is_split_max_min_fairly_among_busy_links():
    # (no background: the budget is the machine's whole; test_sim_cpu.py takes the background's share)
    profile = load_profile("testbed").with_overrides(machine_gbps=20.0, shaped_machine_gbps=None, background_cpu=0.0)
    job = SimJob(Cluster(16, 1, parse_rails("1gbit,250mbit")), profile, calibrate=False)
    # 16 hosts x (1 + 0.25) Gbit/s of payload fits 20: neither link is slowed.
    assert job.link(0, (0, 1)).cap >= job.links[0].rate
    both_fast = SimJob(Cluster(16, 1, parse_rails("1gbit,1gbit")), profile, calibrate=False)
    # 32 links of ~0.956 Gbit/s payload want ~30.6 of 20: each gets 20 / 32.
    assert both_fast.link(0, (0, 1)).cap * 8 / 1e9 == pytest.approx(20 / 32)
    assert both_fast.link(0, (0,)).cap >= both_fast.links[0].rate  # alone, 16 links fit


def test_shaped_links_share_the_machines_shaped_budget():
    profile = load_profile("testbed").with_overrides(machine_gbps=30.0, line_gbps=30.0, shaped_machine_gbps=16.0,
                                                     background_cpu=0.0)
    shaped = SimJob(Cluster(16, 1, parse_rails("1gbit,1gbit")), profile, calibrate=False)
    # 1 Gbit/s is below the line rate: a token bucket shapes it, and 32 such links split 16.
    assert shaped.link(0, (0, 1)).cap * 8 / 1e9 == pytest.approx(16 / 32)
    unshaped = SimJob(Cluster(16, 1, parse_rails("100gbit,100gbit")), profile, calibrate=False)
    assert unshaped.link(0, (0, 1)).cap * 8 / 1e9 == pytest.approx(30 / 32)


def test_validation_compares_each_case_and_measures_the_spread_of_repeats():
    from nezha.sim.cli import allreduce_records
    from nezha.sim.validate import repeatability, rows, summary

    profile = load_profile("testbed")
    sim = allreduce_records(Cluster(4, 1, parse_rails("1gbit,1gbit")), profile, [8, 1 << 20])
    off = [dict(r, time_us=r["time_us"] * 1.25) for r in sim]
    measured = {"cases": [{"hosts": 4, "rates": ["1gbit", "1gbit"], "impl": "nezha-2rails", "records": sim},
                          {"hosts": 4, "rates": ["1gbit", "250mbit"], "impl": "nezha-2rails", "records": off}],
                "training": []}
    table = rows(measured, profile)
    assert [r["size"] for r in table] == ["8", "1M", "8", "1M"]
    assert table[0]["error"] == pytest.approx(0, abs=1e-9)
    assert table[2]["error"] == pytest.approx(1 / 1.25 - 1)  # the 8 B op is inline: rates do not matter
    summ = summary(table)
    assert summ["nezha_cases"] == 4 and summ["nezha_worst_abs_error"] >= 0.2
    spread = {r["what"]: r["spread"] for r in repeatability(measured)}
    assert spread == {"8": pytest.approx(0.25)}
    # 4 x 4 is another experiment than 4 x 1: its inline op is never a repeat of theirs
    four = allreduce_records(Cluster(4, 4, parse_rails("1gbit,1gbit")), profile, [8])
    measured["cases"].append({"hosts": 4, "ranks_per_host": 4, "rates": ["1gbit", "1gbit"], "impl": "nezha-2rails",
                              "records": [dict(r, time_us=r["time_us"] * 5) for r in four]})
    repeats = repeatability(measured)
    assert [(r["hosts"], r["ranks_per_host"], r["what"]) for r in repeats] == [(4, 1, "8")]
    assert repeats[0]["spread"] == pytest.approx(0.25)


def test_per_experiment_pools_a_job_sizes_inline_runs_by_their_median():
    from nezha.sim.cli import allreduce_records
    from nezha.sim.validate import per_experiment, rows

    profile = load_profile("testbed")
    sim = allreduce_records(Cluster(4, 1, parse_rails("1gbit,1gbit")), profile, [8, 1 << 20])
    cases = [{"hosts": 4, "rates": rates, "impl": impl,
              "records": [dict(r, time_us=r["time_us"] * f) for r in sim]}
             for rates, impl, f in ((["1gbit", "1gbit"], "nezha-2rails", 1.0), (["1gbit", "1gbit"], "nezha-rail0", 2.0),
                                    (["1gbit", "250mbit"], "nezha-2rails", 1.1))]
    table = rows({"cases": cases, "training": []}, profile)
    pooled = per_experiment(table)
    inline = [r for r in pooled if r["size"] == "8"]
    assert len(inline) == 1 and inline[0]["impl"] == "nezha, median of 3 runs"
    assert inline[0]["measured"] == pytest.approx(sim[0]["time_us"] * 1.1)  # median of x1, x2, x1.1
    assert inline[0]["error"] == pytest.approx(1 / 1.1 - 1)
    # a rail-bound size is its own experiment per case: all three kept as they were
    assert [r["error"] for r in pooled if r["size"] == "1M"] == [r["error"] for r in table if r["size"] == "1M"]


def test_per_experiment_pools_a_case_with_its_repeats_from_other_runs():
    from nezha.sim.cli import allreduce_records
    from nezha.sim.validate import per_experiment, rows

    profile = load_profile("testbed")
    sim = allreduce_records(Cluster(4, 1, parse_rails("1gbit,250mbit")), profile, [1 << 20])
    # the same case measured in three runs (three measurement files merged), and another case once
    runs = [{"hosts": 4, "rates": ["1gbit", "250mbit"], "impl": "nezha-2rails",
             "records": [dict(r, time_us=r["time_us"] * f) for r in sim]} for f in (1.0, 1.5, 0.9)]
    other = {"hosts": 4, "rates": ["1gbit", "250mbit"], "impl": "nezha-rail0",
             "records": [dict(r, time_us=r["time_us"] * 3) for r in sim]}
    table = rows({"cases": runs + [other], "training": []}, profile)
    pooled = per_experiment(table)
    assert [r["impl"] for r in pooled] == ["nezha-2rails, median of 3 runs", "nezha-rail0"]
    assert pooled[0]["measured"] == pytest.approx(sim[0]["time_us"])  # median of x1, x1.5, x0.9
    assert pooled[0]["error"] == pytest.approx(0.0, abs=1e-9)
    assert pooled[1] == table[-1]  # measured once: kept as it was


def test_per_experiment_pools_training_repeats_whatever_split_each_run_sent():
    from nezha.sim.validate import per_experiment

    base = {"what": "train", "hosts": 8, "ranks_per_host": 1, "rates": "1gbit+1gbit", "impl": "nezha-2rails",
            "simulated": 100.0}
    table = [dict(base, size=f"mlp46m (rails {split})", measured=m, error=100.0 / m - 1)
             for split, m in (("48/52", 90.0), ("93/7", 150.0), ("51/49", 110.0))]
    pooled = per_experiment(table)
    assert len(pooled) == 1 and pooled[0]["size"] == "mlp46m"
    assert pooled[0]["measured"] == 110.0 and pooled[0]["error"] == pytest.approx(100 / 110 - 1)
