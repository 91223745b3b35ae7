"""Command line of the simulator.

    python -m nezha.sim allreduce --hosts 16 --ranks-per-host 1 --rails 1gbit,250mbit --sizes 1M,64M --json F
    python -m nezha.sim train --model mlp46m --hosts 8 --rails 1gbit,1gbit --compute-ms 400 --json F
    python -m nezha.sim cut --hosts 4 --rails 1gbit,1gbit --size 64M --rail 1 --at 2.0
    python -m nezha.sim calibrate --measured benchmarks/out/sim_calibration.json --out F
    python -m nezha.sim validate --measured benchmarks/out/sim_validation.json --markdown F
    python -m nezha.sim predict --nodes 8,16,...,1024 --json F --plot-dir benchmarks

`--profile` names the machine's software costs (nezha/sim/profiles: `testbed` is this repository's
namespace testbed, `cluster` the V100-era cluster of the predictions) or a JSON path.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import List, Optional

from nezha.bench.metrics import algbw_gbps, busbw_gbps
from nezha.bench.sizes import format_size, parse_sizes
from nezha.bench.timing import IterationPolicy

from . import train as train_model
from .cluster import Cluster, Profile, load_profile, parse_rails
from .engine import SimJob


def allreduce_records(cluster: Cluster, profile: Profile, sizes: List[int], iters: Optional[int] = None,
                      warmup: int = 2) -> List[dict]:
    """nezha-bench's view: one job, sizes in order, each size's median after `warmup` calls over
    `iters` calls (None: nezha-bench's --iters auto, about a second of calls, so a shaped link's
    bucket drains as it does in the benchmark)."""
    job = SimJob(cluster, profile)
    policy = IterationPolicy(iters=iters, warmup=warmup)
    out = []
    for size in sizes:
        warm = [job.allreduce(size).seconds for _ in range(max(1, warmup))]
        count = policy.timed_iterations(statistics.median(warm) * 1e6)
        t_us = statistics.median(job.allreduce(size).seconds for _ in range(count)) * 1e6
        algbw = algbw_gbps(size, t_us) if t_us > 0 else 0.0
        out.append({"bytes": size, "time_us": t_us,
                    "busbw_gbps": busbw_gbps("allreduce", algbw, cluster.ranks) if t_us > 0 else 0.0})
    return out


def _cluster(args) -> Cluster:
    return Cluster(args.hosts, args.ranks_per_host, parse_rails(args.rails))


def _write(records, path: Optional[str]) -> None:
    text = json.dumps(records, indent=2)
    if path:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    else:
        print(text)


def _add_cluster_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hosts", type=int, required=True)
    p.add_argument("--ranks-per-host", type=int, default=1)
    p.add_argument("--rails", required=True,
                   help="one rate per rail, each optionally kind:rate (kinds tcp, ofi, mptcp, agg), e.g. 1gbit,250mbit")
    p.add_argument("--profile", default="testbed", help="software costs: a name in nezha/sim/profiles or a JSON path")
    p.add_argument("--json", default=None, help="write the records here (default: stdout)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m nezha.sim", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    ar = sub.add_parser("allreduce", help="allreduce time and busbw per size")
    _add_cluster_args(ar)
    ar.add_argument("--sizes", default="8,1K,64K,1M,16M,64M", help="bytes per rank, e.g. 8,64K,1M,64M")
    ar.add_argument("--iters", type=int, default=None, help="calls per size (default: about a second's, as nezha-bench --iters auto)")

    tr = sub.add_parser("train", help="samples/s of data-parallel training")
    _add_cluster_args(tr)
    tr.add_argument("--model", default="mlp46m", choices=sorted(train_model.MODELS))
    tr.add_argument("--batch-size", type=int, default=16, help="per rank")
    tr.add_argument("--compute-ms", type=float, required=True,
                    help="one step's compute on one rank (forward, backward, optimizer) as the ranks run it")
    tr.add_argument("--steps", type=int, default=6)

    cut = sub.add_parser("cut", help="a stream of allreduces with a rail cut: how long the job stalls")
    _add_cluster_args(cut)
    cut.add_argument("--size", default="64M")
    cut.add_argument("--rail", type=int, default=1)
    cut.add_argument("--at", type=float, default=1.0, help="simulated seconds after calibration")
    cut.add_argument("--restore", type=float, default=None, help="link back up at this time")
    cut.add_argument("--duration", type=float, default=4.0)

    va = sub.add_parser("validate", help="the simulator against the testbed's measurements")
    va.add_argument("--measured", required=True, nargs="+",
                    help="benchmarks/sim_validation.py's summary JSON, and repeats of its training runs")
    va.add_argument("--profile", default="testbed")
    va.add_argument("--markdown", default=None, help="write the validation table here")
    va.add_argument("--json", default=None)

    ca = sub.add_parser("calibrate", help="fit a profile's software costs to measurements (scipy)")
    ca.add_argument("--measured", required=True, nargs="+",
                    help="JSON with one_host_small [{ranks, time_us}] and unshaped [{hosts, rails, records}] "
                         "(with --only handoff: one or more runs with striped [{hosts, gbps, records}])")
    ca.add_argument("--base", default="testbed", help="profile whose other fields are kept")
    ca.add_argument("--out", default=None, help="write the fitted profile here")
    ca.add_argument("--keep-step-costs", action="store_true",
                    help="keep --base's TCP step cost and step CPU (the unshaped runs hardly separate them from "
                         "the machine's byte budget) and fit the rest")
    ca.add_argument("--only", choices=["handoff"], default=None,
                    help="fit only this to the measurements (handoff: the striped runs' hand-off CPU), "
                         "every other field kept from --base")

    pr = sub.add_parser("predict", help="8 to 1024 nodes of a multi-rail cluster: nezha, Gloo, MPTCP")
    pr.add_argument("--nodes", default="8,16,32,64,128,256,512,1024")
    pr.add_argument("--profile", default="cluster")
    pr.add_argument("--json", default=None)
    pr.add_argument("--plot-dir", default=None, help="write predict_busbw.png and predict_training.png here")
    pr.add_argument("--markdown", default=None)
    return parser


def run_cut(args) -> dict:
    job = SimJob(_cluster(args), load_profile(args.profile))
    size = parse_sizes(args.size)[0]
    origin = job.now
    job.cut(args.rail, origin + args.at, origin + args.restore if args.restore is not None else float("inf"))
    ops = []
    while job.now - origin < args.duration:
        t0 = job.now - origin
        r = job.allreduce(size)
        ops.append({"start_s": round(t0, 6), "time_us": r.seconds * 1e6, "failed_rails": list(r.failed_rails),
                    "bytes_per_rail": {str(k): v for k, v in sorted(r.shares.items())}})
    normal = statistics.median(o["time_us"] for o in ops if o["start_s"] + o["time_us"] * 1e-6 < args.at) \
        if any(o["start_s"] + o["time_us"] * 1e-6 < args.at for o in ops) else 0.0
    hit = [o for o in ops if o["failed_rails"]]
    return {"bytes": size, "normal_time_us": normal,
            "stall_ms": (hit[0]["time_us"] - normal) / 1e3 if hit and normal else None,
            "events": [{"t_s": round(t - origin, 6), "what": w} for t, w in job.events], "ops": ops}


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "allreduce":
            records = allreduce_records(_cluster(args), load_profile(args.profile), parse_sizes(args.sizes), args.iters)
            _write(records, args.json)
            if args.json:
                for r in records:
                    print(f"{format_size(r['bytes']):>6}  {r['time_us']:12.1f} us  {r['busbw_gbps']:7.3f} Gbit/s")
        elif args.command == "train":
            spec = train_model.model(args.model)
            job = SimJob(_cluster(args), load_profile(args.profile))
            sps, step_s = train_model.samples_per_second(job, spec, args.compute_ms * 1e-3, args.batch_size, args.steps)
            _write({"model": spec.name, "gradient_bytes": spec.gradient_bytes, "ranks": job.cluster.ranks,
                    "batch_size": args.batch_size, "compute_ms": args.compute_ms, "step_s": step_s,
                    "samples_per_s": sps}, args.json)
        elif args.command == "cut":
            _write(run_cut(args), args.json)
        elif args.command == "validate":
            from .validate import run_validation
            return run_validation(args)
        elif args.command == "calibrate":
            from .calibrate import run_calibration
            return run_calibration(args)
        elif args.command == "predict":
            from .predict import run_prediction
            return run_prediction(args)
    except ValueError as e:
        print(f"nezha.sim: {e}", file=sys.stderr)
        return 2
    return 0
