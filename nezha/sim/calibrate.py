"""`python -m nezha.sim calibrate`: fit the testbed profile's software costs to measurements that
are not the validation's (benchmarks/sim_calibration.py).

The testbed's hosts are namespaces of one machine, so its CPU is a budget its cores' worth shared
by every process of the job (cluster.Profile). Each source fits what it isolates, in order:
  * the CPU counters of the one-host inline series (`one_host_small`: the 8 B and 1 KB allreduce of
    n numpy ranks on one host, negotiation alone): a rank's CPU per operation is its own work plus a
    share of the wall time (its loops' timers and wake-ups); the slope is background_cpu;
  * the times of that series: the negotiation's path (op_us, per_rank_us), its CPU per rank
    (negotiation_cpu_us) and the inline bytes' cost on rank 0 (inline_ns_per_byte);
  * `unshaped`: nezha-bench on the testbed with its rails unshaped, one rank per host, 2 to 16
    hosts, and the one-host 64 KB - 64 MB allreduces (`one_host_mid`, `one_host_large`, and the
    series' ops too large to travel inline), which run the host lane alone: a collective step's
    software cost and CPU (tcp and shm), the machine's byte budget and its memory budget, fitted
    through the simulator itself with the negotiation fixed;
  * `shaped`: nezha-bench on two shaped rails faster than any validation case's (8 hosts x 2 x
    2 Gbit/s): the machine's byte budget while its links are shaped (each packet also passes a
    token bucket on the same cores), from the 4 MB and larger allreduces;
  * `striped`: nezha-bench on 6 and 12 hosts x 2 x 1 Gbit/s, then on the first rail alone: a
    message step's wait for a core (wake_us) from the single rail's 4-16 KB allreduces, whose
    time is their latency; the striped hand-off from the two rails' 32-256 KB allreduces;
  * Gloo beside Nezha on the unshaped runs: Gloo's per-operation cost, per-step cost and CPU.
The machine is shared with other work (builds, other measurements): sim_calibration.py records per
part the cores that work took, and each point is simulated with the rest of the cores
(`other_cores`); the profile keeps the whole machine's. The fits minimise squared log errors
(every size weighs alike) with scipy's least_squares.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Dict, List, Optional

from nezha.bench.sizes import format_size

from . import baselines
from .cli import allreduce_records
from .cluster import Cluster, Profile, RailModel, load_profile
from .engine import SimJob

UNSHAPED_GBPS = 1000.0  # a link no shaper limits: the machine's budget binds first


def _rail() -> List[RailModel]:
    return [RailModel("rail0:tcp", "tcp", UNSHAPED_GBPS)]


def _theirs(prof: Profile, point: Dict) -> Profile:
    """The profile as the machine was while `point` was measured: other jobs on it took
    point["other_cores"] of its cores (sim_calibration.py measures them per part), so the job had
    the rest for its work and for the bytes its cores move."""
    other = point.get("other_cores", 0.0)
    if not other or not prof.cpu_cores:
        return prof
    left = max(0.25 * prof.cpu_cores, prof.cpu_cores - other)
    share = left / prof.cpu_cores
    return prof.with_overrides(cpu_cores=left, shm_gbps=prof.shm_gbps * share,
                               machine_gbps=prof.machine_gbps * share if prof.machine_gbps else None,
                               shaped_machine_gbps=prof.shaped_machine_gbps * share
                               if prof.shaped_machine_gbps else None,
                               line_gbps=prof.line_gbps * share)


def _with_other_load(measured: Dict) -> Dict:
    """Each point and case tagged with the cores other jobs took during its part."""
    other = measured.get("other_cores", {})
    out = dict(measured)
    for part in ("one_host_small", "one_host_mid", "one_host_large"):
        out[part] = [dict(p, other_cores=other.get(part, 0.0)) for p in measured.get(part, [])]
    out["unshaped"] = [dict(c, other_cores=other.get(f"unshaped-h{c['hosts']}", 0.0))
                       for c in measured.get("unshaped", [])]
    out["shaped"] = [dict(c, other_cores=other.get(f"shaped-h{c['hosts']}", 0.0)) for c in measured.get("shaped", [])]
    out["striped"] = [dict(c, other_cores=other.get(f"striped-h{c['hosts']}", c.get("other_cores", 0.0)))
                      for c in measured.get("striped", [])]
    return out


def _inline(point: Dict, base: Profile) -> bool:
    return point["ranks"] >= 2 and point.get("bytes", 8) * (point["ranks"] - 1) <= base.inline_bytes


def fit_background(points: List[Dict]) -> float:
    """Least-squares slope of the other ranks' CPU per operation over its wall time (inline ops:
    the same work at every job size, so what grows with the time is what the ranks burn meanwhile)."""
    pts = [(p["time_us"], p["cpu_us_others"]) for p in points if p.get("cpu_us_others") is not None]
    if len(pts) < 3:
        return 0.0
    mt = sum(t for t, _ in pts) / len(pts)
    mc = sum(c for _, c in pts) / len(pts)
    var = sum((t - mt) ** 2 for t, _ in pts)
    return max(0.0, sum((t - mt) * (c - mc) for t, c in pts) / var) if var else 0.0


def _negotiation_points(measured: Dict) -> List[Dict]:
    """The unshaped testbed runs' allreduces, one rank per host: their negotiation crosses the network
    as in every validation and prediction case. (Ranks of one host negotiate through shared memory,
    several times cheaper, which the model does not separate: the one-host series would price every
    cluster's negotiation at that.)"""
    return [{"hosts": c["hosts"], "ranks": c["hosts"], "bytes": r["bytes"], "time_us": r["time_us"],
             "other_cores": c.get("other_cores", 0.0)} for c in measured["unshaped"] for r in c["records"]]


def fit_negotiation(points: List[Dict], base: Profile) -> Dict[str, float]:
    from scipy.optimize import least_squares

    inline = [p for p in points if _inline(p, base)]
    if len(inline) < 4:
        raise ValueError("negotiation needs at least 4 inline points to fit four parameters")

    # The inline bytes' cost is identified only where the series has two sizes (8 B and 1 KB).
    sizes = {p.get("bytes", 8) for p in inline}

    def profile_of(x) -> Profile:
        return base.with_overrides(op_us=float(x[0]), per_rank_us=float(x[1]), negotiation_cpu_us=float(x[2]),
                                   inline_ns_per_byte=float(x[3]) if len(sizes) > 1 else 0.0)

    def residuals(x):
        prof = profile_of(x)
        out = []
        for p in inline:
            hosts = p.get("hosts", 1)
            job = SimJob(Cluster(hosts, p["ranks"] // hosts, _rail()), _theirs(prof, p), calibrate=False)
            out.append(math.log(job.negotiation_seconds(p.get("bytes", 8)) * 1e6 / p["time_us"]))
        return out

    fit = least_squares(residuals, [30.0, 10.0, 20.0, 5.0], bounds=([0.0] * 4, [1e4, 1e4, 1e4, 1e3]),
                        diff_step=1e-3)
    return {"op_us": float(fit.x[0]), "per_rank_us": float(fit.x[1]), "negotiation_cpu_us": float(fit.x[2]),
            "inline_ns_per_byte": float(fit.x[3]) if len(sizes) > 1 else 0.0}


def _lane_points(measured: Dict, base: Profile) -> List[Dict]:
    """One-host allreduces that run the host lane (every one not inline)."""
    pts = [p for p in measured.get("one_host_small", []) if not _inline(p, base)]
    return pts + list(measured.get("one_host_mid", [])) + list(measured.get("one_host_large", []))


def _fit(residuals, x0, lower, upper):
    from scipy.optimize import least_squares

    return [float(v) for v in least_squares(residuals, x0, bounds=(lower, upper), diff_step=1e-3).x]


def _testbed_residuals(cases: List[Dict], prof: Profile, iters: Optional[int] = 3) -> List[float]:
    """Log errors of the testbed runs' allreduces (one rank per host): unshaped rails, or the rates
    a shaped run gives (`gbps`, one per rail). iters None: nezha-bench's auto count, as measured
    (what the engine's striping check needs to reach its verdicts)."""
    out = []
    for case in cases:
        rates = case.get("gbps") or [UNSHAPED_GBPS] * case.get("rails", 1)
        rails = [RailModel(f"rail{i}:tcp", "tcp", g) for i, g in enumerate(rates)]
        sizes = [r["bytes"] for r in case["records"]]
        sim = allreduce_records(Cluster(case["hosts"], 1, rails), _theirs(prof, case), sizes, iters=iters,
                                warmup=1 if iters else 2)
        out += [math.log(s["time_us"] / r["time_us"]) for s, r in zip(sim, case["records"])]
    return out


def _lane_residuals(points: List[Dict], prof: Profile) -> List[float]:
    out = []
    for p in points:  # one host: the allreduce is the host lane alone
        sim = allreduce_records(Cluster(1, p["ranks"], _rail()), _theirs(prof, p), [p["bytes"]], iters=3, warmup=1)
        out.append(math.log(sim[0]["time_us"] / p["time_us"]))
    return out


def fit_network(cases: List[Dict], lane: List[Dict], base: Profile, keep_step_costs: bool = False) -> Dict[str, float]:
    """Each cost from what isolates it, in turn: the network's step cost, step CPU and the machine's
    byte budget from the unshaped runs; the host lane's memory budget from its bandwidth-bound
    allreduces (16 MB and more); its step CPU from the rest of the one-host allreduces.
    keep_step_costs: the base's TCP step cost and step CPU are kept and the byte budget alone is
    fitted. The unshaped runs hardly tell them apart from it (their bytes outweigh a step's few
    microseconds: with the budget refitted, any step cost of 1-10 us or step CPU of 0-10 us fits
    2026-11-30's runs within a tenth of the same squared error), so a refit can move them anywhere."""
    def network(x) -> Profile:
        return base.with_overrides(step_us={**base.step_us, "tcp": x[0], "mptcp": x[0]},
                                   step_cpu_us={**base.step_cpu_us, "tcp": x[1], "mptcp": x[1]},
                                   machine_gbps=x[2], line_gbps=x[2])

    if keep_step_costs:
        kept = [base.step("tcp"), base.step_cpu_us.get("tcp", 0.0)]
        net = kept + _fit(lambda x: _testbed_residuals(cases, network(kept + list(x))), [30.0], [1.0], [1000.0])
    else:
        net = _fit(lambda x: _testbed_residuals(cases, network(x)), [20.0, 10.0, 30.0], [1.0, 0.0, 1.0],
                   [2000.0, 5000.0, 1000.0])
    prof = network(net)
    large = [p for p in lane if p["bytes"] >= 16 << 20]
    small = [p for p in lane if p["bytes"] < 16 << 20]
    shm = _fit(lambda x: _lane_residuals(large, prof.with_overrides(shm_gbps=x[0])), [50.0], [1.0], [1e4])[0] \
        if large else prof.shm_gbps
    prof = prof.with_overrides(shm_gbps=shm)

    def lane_cpu(x) -> Profile:
        return prof.with_overrides(step_cpu_us={**prof.step_cpu_us, "shm": x[0]})

    shm_cpu = _fit(lambda x: _lane_residuals(small, lane_cpu(x)), [10.0], [0.0], [5000.0])[0] if small else 0.0
    return {"step_us_tcp": net[0], "step_cpu_us_tcp": net[1], "machine_gbps": net[2], "shm_gbps": shm,
            "step_cpu_us_shm": shm_cpu}


def fit_shaped_budget(cases: List[Dict], base: Profile) -> Optional[float]:
    """The machine's byte budget under shaped links, from the shaped runs' bandwidth-bound sizes
    (4 MB and more), everything else as fitted before. None without such runs."""
    cases = [dict(c, records=[r for r in c["records"] if r["bytes"] >= 4 << 20]) for c in cases]
    cases = [c for c in cases if c["records"]]
    if not cases:
        return None

    def residuals(gbps: float) -> List[float]:
        return _testbed_residuals(cases, base.with_overrides(shaped_machine_gbps=gbps))

    # The budget shows only where it binds: from a start above what the runs ask of the machine the
    # error is flat and least_squares never leaves it (45 Gbit/s kept where 25 fits). So the start
    # is the best of a grid from the unshaped budget down to a 32nd of it.
    top = base.machine_gbps or 30.0
    start = min((sum(e * e for e in residuals(g)), g) for g in (top * 0.5 ** (i / 8) for i in range(41)))[1]
    return _fit(lambda x: residuals(float(x[0])), [start], [1.0], [1000.0])[0]


LATENCY_BOUND_BYTES = 32 << 10  # below this a shaped rail's allreduce is its negotiation and steps' latency


def _latency_cases(striped: List[Dict]) -> List[Dict]:
    """The striped runs' single-rail allreduces below LATENCY_BOUND_BYTES, on that one rail."""
    cases = [dict(c, gbps=c["gbps"][:1],
                  records=[r for r in c.get("rail0", []) if r["bytes"] < LATENCY_BOUND_BYTES]) for c in striped]
    return [c for c in cases if c["records"]]


def fit_wake(striped: List[Dict], base: Profile) -> Optional[float]:
    """A message step's wait for a core (wake_us), from the allreduces of 4-16 KB the striped runs
    send over their first rail alone (6 and 12 hosts: no validation case's job sizes): too small
    to travel inline or to fill a token bucket, their time is the negotiation (fitted before) and
    the steps' latency. None without such runs."""
    cases = _latency_cases(striped)
    if not cases:
        return None

    def residuals(x) -> List[float]:
        return _testbed_residuals(cases, base.with_overrides(wake_us=float(x[0])))

    return _fit(residuals, [50.0], [0.0], [5000.0])[0]


def fit_handoff(cases: List[Dict], base: Profile, upper_us: float = 100.0, grid_us: float = 1.0) -> Optional[float]:
    """A striped operation's hand-off CPU per rank, from the striped runs' 32-256 KB allreduces on
    two rails (job sizes no validation case has), everything else as fitted before. Their
    single-rail runs are not fitted: they have no hand-off (they show the rest of the model's error
    at those job sizes). None without such runs.

    A grid, not a gradient: the cost decides, through the engine's striping check, whether a size
    runs striped or whole, so the error jumps where a verdict flips. The sum of absolute log errors
    (not squared): one size whose verdict flips does not outweigh the others."""
    cases = [dict(c, records=[r for r in c["records"] if r["bytes"] >= LATENCY_BOUND_BYTES]) for c in cases]
    cases = [c for c in cases if c["records"]]
    if not cases:
        return None

    def error(x: float) -> float:
        return sum(abs(e) for e in _testbed_residuals(cases, base.with_overrides(handoff_cpu_us=x), iters=None))

    coarse = min((error(i * grid_us), i * grid_us) for i in range(int(upper_us / grid_us) + 1))[1]
    fine = [max(0.0, coarse + (i - 10) * grid_us / 10) for i in range(21)]
    return min((error(x), x) for x in fine)[1]


def fit_gloo(cases: List[Dict], base: Profile) -> Dict[str, float]:
    from scipy.optimize import least_squares

    # Gloo's ring skips the chunks an input too small to give every rank one leaves empty (8 B on
    # 4 ranks and more): those sizes are another algorithm's, left out as the validation leaves them.
    cases = [dict(c, gloo=[r for r in c["gloo"] if r["bytes"] // 4 >= c["hosts"]]) for c in cases if c.get("gloo")]

    def profile_of(x) -> Profile:
        return base.with_overrides(step_us={**base.step_us, "gloo": float(x[0])},
                                   step_cpu_us={**base.step_cpu_us, "gloo": float(x[1])},
                                   extra={**base.extra, "gloo_op_us": float(x[2])})

    def residuals(x):
        out = []
        prof = baselines.gloo_profile(profile_of(x))
        for case in cases:
            sizes = [r["bytes"] for r in case["gloo"]]
            other = {"other_cores": case.get("gloo_other_cores", case.get("other_cores", 0.0))}
            sim = allreduce_records(Cluster(case["hosts"], 1, _rail()), _theirs(prof, other), sizes, iters=3, warmup=1)
            out += [math.log(s["time_us"] / r["time_us"]) for s, r in zip(sim, case["gloo"])]
        return out

    if not cases:
        return {}
    fit = least_squares(residuals, [50.0, 50.0, 50.0], bounds=([0.0] * 3, [1e5] * 3), diff_step=1e-3)
    return {"step_us_gloo": float(fit.x[0]), "step_cpu_us_gloo": float(fit.x[1]), "gloo_op_us": float(fit.x[2])}


def calibrate(measured: Dict, base: Profile, measured_name: str, keep_step_costs: bool = False) -> Profile:
    measured = _with_other_load(measured)
    small = measured["one_host_small"]
    prof = base.with_overrides(background_cpu=fit_background([p for p in small if _inline(p, base)]))
    negotiation = _negotiation_points(measured)
    prof = prof.with_overrides(**fit_negotiation(negotiation, prof))
    wake = fit_wake(measured.get("striped", []), prof)
    if wake is not None:
        prof = prof.with_overrides(wake_us=wake)
    net = fit_network(measured["unshaped"], _lane_points(measured, prof), prof, keep_step_costs)
    prof = prof.with_overrides(
        step_us={**prof.step_us, "tcp": net["step_us_tcp"], "mptcp": net["step_us_tcp"]},
        step_cpu_us={**prof.step_cpu_us, "tcp": net["step_cpu_us_tcp"], "mptcp": net["step_cpu_us_tcp"],
                     "shm": net["step_cpu_us_shm"]},
        machine_gbps=net["machine_gbps"], line_gbps=net["machine_gbps"], shm_gbps=net["shm_gbps"])
    prof = prof.with_overrides(shaped_machine_gbps=fit_shaped_budget(measured["shaped"], prof))
    handoff = fit_handoff(measured.get("striped", []), prof)
    if handoff is not None:
        prof = prof.with_overrides(handoff_cpu_us=handoff)
    gloo = fit_gloo(measured["unshaped"], prof)
    if gloo:
        prof = prof.with_overrides(step_us={**prof.step_us, "gloo": gloo["step_us_gloo"]},
                                   step_cpu_us={**prof.step_cpu_us, "gloo": gloo["step_cpu_us_gloo"]},
                                   extra={**prof.extra, "gloo_op_us": gloo["gloo_op_us"]})
    hosts = ", ".join(str(c["hosts"]) for c in measured["unshaped"])
    shaped = ", ".join(f"{c['hosts']} hosts x {' + '.join(f'{g:g}' for g in c['gbps'])} Gbit/s"
                       for c in measured["shaped"])
    sizes = sorted({p.get("bytes", 8) for p in negotiation if _inline(p, prof)})
    small_sizes = " / ".join(f"{b} B" if b < 1024 else format_size(b) for b in sizes)
    other = measured.get("other_cores", {})
    wake_text = ("a step's wait for a core to the striped runs' 4-16 KB allreduces on one shaped rail, "
                 if wake is not None else "")
    source = (f"fitted by `python -m nezha.sim calibrate` to {measured_name} (engine at commit "
              f"{measured.get('commit', '?')}), none of it a validation case: the CPU each rank burns per "
              f"second to the one-host 8 B series ({', '.join(sorted({str(p['ranks']) for p in small}, key=int))} "
              f"ranks), the negotiation to the unshaped testbed runs' {small_sizes} allreduces, "
              f"{wake_text}"
              f"{'(the per-step cost and CPU kept from the base profile) ' if keep_step_costs else 'the per-step cost and CPU, '}"
              f"the machine's byte budget and the host lane's memory budget to unshaped testbed runs "
              f"({hosts} hosts) and one-host 64 KB - 64 MB allreduces, the machine's byte budget under "
              f"shaped links to {shaped or 'no'} shaped testbed runs, Gloo's costs to Gloo beside them; "
              f"other jobs' cores per part: {', '.join(f'{k} {v:.2f}' for k, v in other.items()) or 'not measured'}")
    return prof.with_overrides(source=source)


def calibrate_handoff(measured: Dict, base: Profile, measured_name: str, upper_us: float = 100.0) -> Profile:
    """The striped hand-off alone, fitted on `base` (every other field kept)."""
    cases = _with_other_load(measured)["striped"]
    if not cases:
        raise ValueError(f"{measured_name} has no striped runs (sim_calibration.py --parts striped)")
    handoff = fit_handoff(cases, base, upper_us)
    jobs = ", ".join(dict.fromkeys(f"{c['hosts']} hosts x {' + '.join(f'{g:g}' for g in c['gbps'])} Gbit/s"
                                   for c in cases))
    return base.with_overrides(handoff_cpu_us=handoff, source=(
        f"{base.source}; the striped hand-off (handoff_cpu_us) alone fitted by `python -m nezha.sim calibrate "
        f"--only handoff` to {measured_name} (engine at commit {measured.get('commit', '?')}): the 32-256 KB "
        f"allreduces striped on {jobs}, none a validation case"))


def run_calibration(args) -> int:
    paths = [args.measured] if isinstance(args.measured, str) else list(args.measured)
    runs = [json.loads(Path(p).read_text()) for p in paths]
    if getattr(args, "only", None) == "handoff":
        # Every run's striped cases together: each is one more sample of the same job sizes.
        commits = sorted({r.get("commit", "?") for r in runs})
        measured = {"commit": ", ".join(commits),
                    "striped": [c for r in runs for c in _with_other_load(r)["striped"]]}
        profile = calibrate_handoff(measured, load_profile(args.base), " ".join(paths))
    elif len(runs) != 1:
        raise ValueError("a whole calibration fits one summary (sim_calibration.py --quietest merges runs)")
    else:
        profile = calibrate(runs[0], load_profile(args.base), paths[0], getattr(args, "keep_step_costs", False))
    text = profile.to_json()
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0
