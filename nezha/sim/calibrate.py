"""`python -m nezha.sim calibrate`: fit the testbed profile's software costs to measurements that
are not the validation's.

Two sources, each fitting what it isolates:
  * `one_host_small`: the 8 B allreduce of n numpy ranks on one host (benchmarks/scale_one_host.py),
    which is negotiation alone (it travels inline): op_us + per_rank_us x (n - 1) ** (1 + c), c the
    contention exponent every per-message cost then carries;
  * `unshaped`: nezha-bench on the testbed with its rails unshaped (each host's links as fast as
    the machine moves bytes), which is the per-step cost of a message (small and mid sizes) and the
    machine's byte budget (64 MB), fitted through the simulator itself with the negotiation fixed;
  * `one_host_large`: the 64 MB allreduce of a few numpy ranks on one host, which is the
    hierarchical allreduce's host lane alone (shared memory): the machine's memory budget for it.
The fit minimises squared log errors (every size weighs alike) with scipy's least_squares.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Dict, List

from .cli import allreduce_records
from .cluster import Cluster, Profile, RailModel, load_profile

UNSHAPED_GBPS = 1000.0  # a link no shaper limits: the machine's budget binds first


def fit_negotiation(points: List[Dict]) -> Dict[str, float]:
    from scipy.optimize import least_squares

    n = [p["ranks"] for p in points]
    t = [p["time_us"] for p in points]
    if len(points) < 3:
        raise ValueError("one_host_small needs at least 3 job sizes to fit three parameters")

    def residuals(x):
        return [math.log((x[0] + x[1] * (ni - 1) ** x[2]) / ti) for ni, ti in zip(n, t)]

    fit = least_squares(residuals, [50.0, 20.0, 1.2], bounds=([0.0, 0.0, 0.5], [1e4, 1e4, 3.0]))
    return {"op_us": float(fit.x[0]), "per_rank_us": float(fit.x[1]), "contention_exponent": float(fit.x[2]) - 1}


def fit_network(cases: List[Dict], one_host_large: List[Dict], base: Profile) -> Dict[str, float]:
    from scipy.optimize import least_squares

    def profile_of(x) -> Profile:
        steps = {**base.step_us, "tcp": float(x[0]), "mptcp": float(x[0])}
        return base.with_overrides(step_us=steps, machine_gbps=float(x[1]), line_gbps=float(x[1]),
                                   shm_gbps=float(x[2]))

    def residuals(x):
        out = []
        prof = profile_of(x)
        for case in cases:
            rails = [RailModel(f"rail{i}:tcp", "tcp", UNSHAPED_GBPS) for i in range(case.get("rails", 1))]
            sizes = [r["bytes"] for r in case["records"]]
            sim = allreduce_records(Cluster(case["hosts"], 1, rails), prof, sizes, iters=3, warmup=1)
            out += [math.log(s["time_us"] / r["time_us"]) for s, r in zip(sim, case["records"])]
        for case in one_host_large:  # one host: the allreduce is the host lane alone
            rails = [RailModel("rail0:tcp", "tcp", UNSHAPED_GBPS)]
            sim = allreduce_records(Cluster(1, case["ranks"], rails), prof, [case["bytes"]], iters=3, warmup=1)
            out.append(math.log(sim[0]["time_us"] / case["time_us"]))
        return out

    fit = least_squares(residuals, [50.0, 30.0, 50.0], bounds=([1.0, 1.0, 1.0], [2000.0, 1000.0, 10000.0]),
                        diff_step=1e-3)
    return {"step_us_tcp": float(fit.x[0]), "machine_gbps": float(fit.x[1]), "shm_gbps": float(fit.x[2])}


def calibrate(measured: Dict, base: Profile, measured_name: str) -> Profile:
    neg = fit_negotiation(measured["one_host_small"])
    prof = base.with_overrides(**neg)
    net = fit_network(measured["unshaped"], measured.get("one_host_large", []), prof)
    steps = {**prof.step_us, "tcp": net["step_us_tcp"], "mptcp": net["step_us_tcp"]}
    source = (f"fitted by `python -m nezha.sim calibrate` to {measured_name}: negotiation to the one-host "
              f"8 B series ({', '.join(str(p['ranks']) for p in measured['one_host_small'])} ranks), the per-step "
              f"cost and the machine's byte budget to unshaped testbed runs "
              f"({', '.join(str(c['hosts']) + ' hosts' for c in measured['unshaped'])}), the host lane's memory "
              f"budget to the one-host 64 MB allreduce ({', '.join(str(c['ranks']) + ' ranks' for c in measured.get('one_host_large', []))})")
    return prof.with_overrides(step_us=steps, machine_gbps=net["machine_gbps"], line_gbps=net["machine_gbps"],
                               shm_gbps=net["shm_gbps"], source=source)


def run_calibration(args) -> int:
    measured = json.loads(Path(args.measured).read_text())
    profile = calibrate(measured, load_profile(args.base), args.measured)
    text = profile.to_json()
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0
