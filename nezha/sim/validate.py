"""`python -m nezha.sim validate`: the simulator against the namespace testbed's measurements.

Reads the summary benchmarks/sim_validation.py writes (allreduce times per size for Nezha on both
rails, on rail 0 alone and Gloo on rail 0; the mlp46m training step), simulates every case with the
profile, and lists each case beside its measurement with the error. The headline counts Nezha's
cases (allreduce and training); Gloo is listed from 1 MB up, where its time is its bandwidth (below,
its latency on this testbed is a ~7 ms floor the model does not reproduce).

Per run and per experiment: an allreduce small enough to travel inline with its negotiation touches
no rail, so the runs of one job size (both rails or one, either rates) measure one experiment, and
their times spread 30-90 % between runs (repeatability()). Per experiment, those runs are one case
measured by their median; every other case is its own experiment.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Dict, List

from nezha.bench.sizes import format_size

from . import baselines
from . import train as train_model
from .cli import allreduce_records
from .cluster import Cluster, RailModel, load_profile, parse_rate_gbps
from .engine import SimJob

GLOO_FROM_BYTES = 1 << 20
INLINE_BYTES = 16384  # NEZHA_CONTROL_INLINE_BYTES at its default, as the measurements ran


def _rails(rates: List[str]) -> List[RailModel]:
    return [RailModel(f"rail{i}:tcp", "tcp", parse_rate_gbps(r)) for i, r in enumerate(rates)]


def simulate_case(case: Dict, profile) -> Dict[int, float]:
    rails = _rails(case["rates"])
    impl = case["impl"]
    if impl.endswith("rail0"):
        rails = rails[:1]
    cluster = Cluster(case["hosts"], case.get("ranks_per_host", 1), rails)
    if impl.startswith("gloo"):
        profile = baselines.gloo_profile(profile)
    sizes = [r["bytes"] for r in case["records"]]
    return {r["bytes"]: r["time_us"] for r in allreduce_records(cluster, profile, sizes)}


def rows(measured: Dict, profile) -> List[Dict]:
    out = []
    for case in measured["cases"]:
        if case.get("op", "allreduce") != "allreduce" or not case.get("records"):
            continue
        sim = simulate_case(case, profile)
        for rec in case["records"]:
            if case["impl"].startswith("gloo") and rec["bytes"] < GLOO_FROM_BYTES:
                continue
            rph = case.get("ranks_per_host", 1)
            out.append({"what": "allreduce", "hosts": case["hosts"], "ranks_per_host": rph,
                        "rates": "+".join(case["rates"]),
                        "impl": case["impl"], "size": format_size(rec["bytes"]), "bytes": rec["bytes"],
                        "inline": rec["bytes"] * (case["hosts"] * rph - 1) <= INLINE_BYTES,
                        "measured": rec["time_us"], "simulated": sim[rec["bytes"]],
                        "error": sim[rec["bytes"]] / rec["time_us"] - 1})
    for tr in measured.get("training", []):
        if not tr.get("nezha_step_s") or not tr.get("compute_only_step_s"):
            continue
        cluster = Cluster(tr["hosts"], tr.get("ranks_per_host", 1), _rails(tr["rates"]))
        job = SimJob(cluster, profile)
        spec = train_model.model(tr["model"])
        _, step_s = train_model.samples_per_second(job, spec, tr["compute_only_step_s"], tr["batch_size"])
        sent = tr.get("jobs", {}).get("nezha-2rails", {}).get("tx_bytes_per_rail") or []
        split = "/".join(f"{100 * b / sum(sent):.0f}" for b in sent) if sum(sent) else ""
        out.append({"what": "train", "hosts": tr["hosts"], "ranks_per_host": tr.get("ranks_per_host", 1),
                    "rates": "+".join(tr["rates"]),
                    "impl": "nezha-2rails", "size": tr["model"] + (f" (rails {split})" if split else ""),
                    "measured": tr["nezha_step_s"] * 1e6, "simulated": step_s * 1e6,
                    "error": step_s / tr["nezha_step_s"] - 1})
    return out


def repeatability(measured: Dict) -> List[Dict]:
    """How far apart the testbed's own measurements of one experiment land: the floor under any
    model's error. Identical experiments: an allreduce small enough to travel inline with its
    negotiation in every run of one job size (it never touches a rail); rail 0 alone in case A and
    in case B (rail 1 idle in both); a training configuration run twice. One job size: the same
    hosts and ranks per host (4 x 1 and 4 x 4 are different experiments)."""
    groups: Dict[tuple, List[float]] = {}
    for case in measured["cases"]:
        if case["impl"].startswith("gloo"):
            continue
        rph = case.get("ranks_per_host", 1)
        n = case["hosts"] * rph
        for rec in case["records"]:
            if rec["bytes"] * (n - 1) <= INLINE_BYTES:
                key = (case["hosts"], rph, "inline, every run", rec["bytes"])
            elif case["impl"].endswith("rail0"):
                key = (case["hosts"], rph, "rail 0 alone, cases A and B", rec["bytes"])
            else:
                continue
            groups.setdefault(key, []).append(rec["time_us"])
    for tr in measured.get("training", []):
        key = (tr["hosts"], tr.get("ranks_per_host", 1), "training, repeated",
               tr["model"] + " " + "+".join(tr["rates"]))
        groups.setdefault(key, []).append(tr["nezha_step_s"] * 1e6)
    return [{"hosts": k[0], "ranks_per_host": k[1], "what": format_size(k[3]) if isinstance(k[3], int) else k[3],
             "experiment": k[2], "runs": len(v), "spread": max(v) / min(v) - 1}
            for k, v in sorted(groups.items()) if len(v) > 1]


def per_experiment(table: List[Dict]) -> List[Dict]:
    """The table with each experiment as one case, measured by the median of its runs: Nezha's
    inline allreduces of one job size pooled whatever the rails (see the module's doc; simulated is
    the same for every run: inline, rails and rates do not enter it), and every other case pooled
    with its repeats (the same job, rails, implementation and size in several measurement files)."""
    inline: Dict[tuple, List[Dict]] = {}
    repeats: Dict[tuple, List[Dict]] = {}
    for r in table:
        if r.get("inline") and r["impl"].startswith("nezha"):
            inline.setdefault((r["hosts"], r["ranks_per_host"], r["bytes"]), []).append(r)
        else:
            repeats.setdefault((r["what"], r["hosts"], r["ranks_per_host"], r["rates"], r["impl"],
                                r.get("bytes", _model(r["size"]))), []).append(r)
    out = [_median_case(runs[0], runs, runs[0]["impl"]) if len(runs) > 1 else runs[0]
           for runs in repeats.values()]
    for (hosts, rph, nbytes), runs in sorted(inline.items()):
        out.append(_median_case({"what": "allreduce", "hosts": hosts, "ranks_per_host": rph, "rates": "any",
                                 "size": format_size(nbytes), "bytes": nbytes, "inline": True},
                                runs, "nezha"))
    return out


def _model(size: str) -> str:
    """A training row's size without the split its run sent ("mlp46m (rails 48/52)")."""
    return size.split(" (rails")[0]


def _median_case(case: Dict, runs: List[Dict], impl: str) -> Dict:
    measured = statistics.median(r["measured"] for r in runs)
    simulated = statistics.median(r["simulated"] for r in runs)
    size = case["size"] if case["what"] == "allreduce" else _model(case["size"])
    return {**case, "impl": f"{impl}, median of {len(runs)} runs", "size": size, "runs": len(runs),
            "measured": measured, "simulated": simulated, "error": simulated / measured - 1}


def summary(table: List[Dict]) -> Dict:
    """Median and worst absolute error, Nezha's cases and Gloo's apart; then Nezha's per
    ranks-per-host and per size class (what the errors depend on)."""
    out = _errors(table)
    classes = {"8 B - 1 KB": ("8", "1K"), "64 KB - 256 KB": ("64K", "256K"), ">= 1 MB": ("1M", "4M", "16M", "64M")}
    for rph in sorted({r["ranks_per_host"] for r in table}):
        mine = [r for r in table if r["ranks_per_host"] == rph]
        for label, sizes in classes.items():
            part = _errors([r for r in mine if r["what"] == "allreduce" and r["size"] in sizes])
            if part["nezha_cases"]:
                out[f"ranks_per_host={rph}, {label}"] = part
        part = _errors([r for r in mine if r["what"] == "train"])
        if part["nezha_cases"]:
            out[f"ranks_per_host={rph}, training"] = part
    return out


def _errors(table: List[Dict]) -> Dict:
    nezha = [abs(r["error"]) for r in table if r["impl"].startswith("nezha")]
    gloo = [abs(r["error"]) for r in table if r["impl"].startswith("gloo")]
    out = {"nezha_cases": len(nezha)}
    if nezha:
        out.update(nezha_median_abs_error=statistics.median(nezha), nezha_worst_abs_error=max(nezha),
                   nezha_over_10=sum(e > 0.1 for e in nezha), nezha_over_20=sum(e > 0.2 for e in nezha))
    if gloo:
        out.update(gloo_cases=len(gloo), gloo_median_abs_error=statistics.median(gloo), gloo_worst_abs_error=max(gloo))
    return out


def _fmt_us(us: float) -> str:
    return f"{us / 1e6:.3f} s" if us >= 1e6 else f"{us / 1e3:.2f} ms" if us >= 1e3 else f"{us:.0f} us"


def _summary_lines(summ: Dict) -> List[str]:
    lines = ["| cases | n | median abs. error | worst | over 10 % | over 20 % |", "|---|---:|---:|---:|---:|---:|"]
    groups = [("Nezha, all", summ)] + [(k, v) for k, v in summ.items() if isinstance(v, dict)]
    for label, g in groups:
        if g.get("nezha_cases"):
            lines.append(f"| {label} | {g['nezha_cases']} | {g['nezha_median_abs_error']:.1%} | "
                         f"{g['nezha_worst_abs_error']:.1%} | {g['nezha_over_10']} | {g['nezha_over_20']} |")
    if "gloo_median_abs_error" in summ:
        lines.append(f"| Gloo, >= 1 MB | {summ['gloo_cases']} | {summ['gloo_median_abs_error']:.1%} | "
                     f"{summ['gloo_worst_abs_error']:.1%} | | |")
    return lines


def _case_lines(table: List[Dict]) -> List[str]:
    lines = ["| hosts x ranks | rails | impl | size | measured | simulated | error |",
             "|---:|---|---|---:|---:|---:|---:|"]
    for r in table:
        lines.append(f"| {r['hosts']} x {r['ranks_per_host']} | {r['rates']} | {r['impl']} | {r['size']} | "
                     f"{_fmt_us(r['measured'])} | {_fmt_us(r['simulated'])} | {r['error']:+.1%} |")
    return lines


def markdown(table: List[Dict], summ: Dict, profile_name: str, measured_path: str, repeats: List[Dict],
             experiments: List[Dict] = (), summ_experiments: Dict = None) -> str:
    lines = [f"Profile `{profile_name}`; measurements `{measured_path}`.", "", "Per run:", ""]
    lines += _summary_lines(summ)
    if summ_experiments:
        lines += ["", "Per experiment (each job size's inline allreduces, one experiment whatever the rails; "
                  "every other case with its repeats in the other measurement files; each measured by the "
                  "median of its runs):", ""]
        lines += _summary_lines(summ_experiments)
    lines += [""] + _case_lines(table)
    pooled = [r for r in experiments if "runs" in r]
    if pooled:
        lines += ["", "The experiments measured more than once, by the median of their runs:", ""] + _case_lines(pooled)
    if repeats:
        lines += ["", "Repeatability: one experiment measured more than once (max / min - 1 over its runs).", "",
                  "| hosts x ranks | what | experiment | runs | spread |", "|---:|---|---|---:|---:|"]
        lines += [f"| {r['hosts']} x {r['ranks_per_host']} | {r['what']} | {r['experiment']} | {r['runs']} | "
                  f"{r['spread']:.0%} |" for r in repeats]
    return "\n".join(lines) + "\n"


def load_measurements(paths: List[str]) -> Dict:
    """sim_validation.py's summaries (cases and training) and repeats (a list of training runs)."""
    merged: Dict = {"cases": [], "training": []}
    for path in paths:
        data = json.loads(Path(path).read_text())
        if isinstance(data, list):
            merged["training"] += data
        else:
            merged["cases"] += data.get("cases", [])
            merged["training"] += data.get("training", [])
    return merged


def run_validation(args) -> int:
    measured = load_measurements(args.measured)
    profile = load_profile(args.profile)
    table = rows(measured, profile)
    summ = summary(table)
    experiments = per_experiment(table)
    summ_experiments = summary(experiments)
    repeats = repeatability(measured)
    text = markdown(table, summ, profile.name, ", ".join(args.measured), repeats, experiments, summ_experiments)
    if args.markdown:
        Path(args.markdown).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summ, "rows": table, "repeatability": repeats,
                                               "summary_per_experiment": summ_experiments,
                                               "experiment_rows": experiments}, indent=2) + "\n")
    print(text)
    return 0
