#!/usr/bin/env python3
"""Measures what `python -m nezha.sim calibrate` fits the testbed profile to, none of it a case of
the validation (benchmarks/sim_validation.py): the 8 B and 1 KB allreduce of 2 to 32 numpy ranks
on one host (negotiation, the inline result's bytes, and from 32 ranks the host lane's steps), the
64 and 256 KB allreduce of 8 to 32 ranks on one host (the host lane's steps with many processes on
the machine's cores), the 64 MB allreduce of 4 ranks on one host (the host lane: shared memory),
nezha-bench on rail 0 of an unshaped 2- to 16-host testbed with Gloo beside it on the same
interface (the per-step cost and CPU, the machine's byte budget, Gloo's per-step cost), and
nezha-bench on two shaped rails faster than the validation's, 8 hosts x 2 x 2 Gbit/s, 4-64 MB (the
machine's byte budget when every packet also passes a token bucket: 32 Gbit/s asked of it), and
nezha-bench's 4-256 KB allreduces on 6 and 12 hosts x 2 x 1 Gbit/s, then on the first rail alone
(what a striped operation costs the shared cores beyond its shares: its hand-offs to the rails'
workers; and from the single rail's 4 and 16 KB, a message step's wait for a core).

The machine is shared with other work (builds, other measurements), which slows whatever runs
beside it: each part records the cores that other work took meanwhile (other_cores; the
calibration gives the job the rest), every run's summary is kept under runs/, and --quietest
writes the summary of several runs' quietest parts. Run it with the engine the validation
measured (a worktree at that commit) when the engine has changed since.

    .venv/bin/python benchmarks/sim_calibration.py            # root; ~4 minutes
    .venv/bin/python benchmarks/sim_calibration.py --parts shaped   # one part alone (merge with --quietest)
    .venv/bin/python benchmarks/sim_calibration.py --quietest benchmarks/out/sim-calibration/runs/run-*.json
    .venv/bin/python -m nezha.sim calibrate --measured benchmarks/out/sim_calibration.json \\
        --out nezha/sim/profiles/testbed.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.append(str(REPO_ROOT))

from nezha.sim.cluster import parse_rate_gbps  # noqa: E402
from nezha.testbed import Testbed  # noqa: E402
from run_matrix import run_job  # noqa: E402

OUT_DIR = BENCH_DIR / "out" / "sim-calibration"
SUMMARY = BENCH_DIR / "out" / "sim_calibration.json"
UNSHAPED_SIZES = "8,1K,64K,256K,1M,4M,64M"
SHAPED_SIZES = "4M,16M,64M"
SHAPED_HOSTS, SHAPED_RATE = 8, "2gbit"  # two rails at this rate: no validation case's rates
# Striped small and mid-size allreduces against one rail alone, at job sizes no validation case has:
# what a striped operation costs the hosts' shared cores beyond its shares (the hand-offs).
# Their single rail's 4 and 16 KB allreduces: a step's latency (too small to fill a token bucket).
STRIPED_HOSTS, STRIPED_RATE, STRIPED_SIZES = "6,12", "1gbit", "4K,16K,32K,64K,128K,256K"
JOB_TIMEOUT_S = 300.0
class OtherLoad:
    """What else ran on the machine while a part ran (other jobs build and measure on it): the
    cores busy that this script's jobs (children: nezharun and its ranks) did not use, averaged
    over the part. The calibration gives the job the rest of the machine's cores."""

    def __enter__(self):
        self.busy0, self.wall0 = busy_cpu_seconds(), time.monotonic()
        self.own0 = children_cpu_seconds()
        return self

    def __exit__(self, *exc):
        wall = time.monotonic() - self.wall0
        other = busy_cpu_seconds() - self.busy0 - (children_cpu_seconds() - self.own0)
        self.cores = max(0.0, other / wall) if wall > 0 else 0.0
        return False


def busy_cpu_seconds() -> float:
    """CPU seconds processes kept the machine busy since boot (/proc/stat: user, nice, system; not
    the interrupts' and softirqs' time, which is mostly the testbed's own packets, charged to no
    process)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields[:3]) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_host(ranks: str, size: str, name: str) -> list:
    """The allreduce of `size` bytes of numpy ranks on one host (scale_one_host.py), per job size."""
    path = OUT_DIR / f"{name}.json"
    subprocess.run([sys.executable, str(BENCH_DIR / "scale_one_host.py"), "--ranks", ranks, "--impls", "nezha",
                    "--sizes", size, "--iters", "30", "--json", str(path), "--timeout", "300",
                    "--plot", str(OUT_DIR / f"{name}.png")],
                   check=True, cwd=REPO_ROOT)
    out = []
    for record in json.loads(path.read_text())["records"]:
        for entry in record.get("ops", ()):
            if entry["op"] == "allreduce":
                out.append({"ranks": record["ranks"], "bytes": entry["bytes"], "time_us": entry["time_us"],
                            "cpu_us_rank0": entry.get("cpu_us_rank0"),
                            "cpu_us_others": entry.get("cpu_us_others_mean")})
    return out


def bench_on_testbed(name: str, testbed: Testbed, sizes: str, bench_args: list) -> list:
    """nezha-bench's allreduce records on `testbed` (brought up and torn down here), one rank per
    host; its JSON and log are kept under OUT_DIR as `name`."""
    testbed.up()
    try:
        return bench_job(name, testbed, testbed.nezharun_args(), sizes, bench_args)
    finally:
        testbed.down()


def bench_job(name: str, testbed: Testbed, nezharun_args: list, sizes: str, bench_args: list) -> list:
    """One nezha-bench job on `testbed`, which is up."""
    path = OUT_DIR / f"{name}.json"
    argv = [sys.executable, "-m", "nezha.runner", "-np", str(len(testbed.hosts)), *nezharun_args, "--",
            sys.executable, "-m", "nezha.bench", "--op", "allreduce", "--sizes", sizes,
            "--dtype", "float32", "--iters", "auto", "--warmup", "2", "--json", str(path), *bench_args]
    error = run_job(argv, OUT_DIR / f"{name}.log", JOB_TIMEOUT_S)
    if error:
        raise RuntimeError(f"{name} job failed: {error}")
    return json.loads(path.read_text())


def unshaped(hosts: int) -> dict:
    testbed = Testbed(hosts, 1, rates="off", prefix="nzcal")
    rows = bench_on_testbed(f"unshaped-h{hosts}", testbed, UNSHAPED_SIZES,
                            ["--impl-label", "nezha-rail0", "--baseline", "gloo", "--gloo-ifname",
                             testbed.interface(0), "--baseline-label", "gloo-rail0"])
    records = [with_cpu(r, {"bytes": r["bytes"], "time_us": r["time_us"]}) for r in rows if r.get("impl") != "gloo-rail0"]
    gloo = [{"bytes": r["bytes"], "time_us": r["time_us"]} for r in rows if r.get("impl") == "gloo-rail0"]
    return {"hosts": hosts, "rails": 1, "records": records, "gloo": gloo}


def shaped(hosts: int, rate: str) -> dict:
    """nezha-bench on two rails shaped to `rate` each (the validation's kind of link, faster)."""
    testbed = Testbed(hosts, 2, rates=[rate, rate], prefix="nzcal")
    rows = bench_on_testbed(f"shaped-h{hosts}", testbed, SHAPED_SIZES, ["--impl-label", "nezha-2rails"])
    records = [with_cpu(r, {"bytes": r["bytes"], "time_us": r["time_us"]}) for r in rows]
    return {"hosts": hosts, "rails": 2, "gbps": [float(rate[:-4])] * 2, "records": records}


def striped(hosts: int, rate: str) -> dict:
    """nezha-bench on two rails of `rate`, then on the first alone, on one testbed."""
    testbed = Testbed(hosts, 2, rates=[rate, rate], prefix="nzcal")
    testbed.up()
    try:
        both = bench_job(f"striped-h{hosts}", testbed, testbed.nezharun_args(), STRIPED_SIZES,
                         ["--impl-label", "nezha-2rails"])
        args = testbed.nezharun_args()
        args[args.index("--rails") + 1] = testbed.rail_subnets[0]
        alone = bench_job(f"striped-h{hosts}-rail0", testbed, args, STRIPED_SIZES, ["--impl-label", "nezha-rail0"])
    finally:
        testbed.down()
    records = [with_cpu(r, {"bytes": r["bytes"], "time_us": r["time_us"],
                            "shares": [round(x["share"], 3) for x in r.get("rails", ())]}) for r in both]
    return {"hosts": hosts, "rails": 2, "gbps": [parse_rate_gbps(rate)] * 2, "records": records,
            "rail0": [with_cpu(r, {"bytes": r["bytes"], "time_us": r["time_us"]}) for r in alone]}


def with_cpu(bench_record: dict, record: dict) -> dict:
    """`record` with the ranks' mean CPU per call where nezha-bench measured it."""
    if bench_record.get("cpu_us"):
        record["cpu_us"] = bench_record["cpu_us"]
    return record


def part_data(summary: dict, name: str):
    for kind in ("unshaped", "shaped", "striped"):
        if name.startswith(f"{kind}-h"):
            hosts = int(name[len(kind) + 2:])
            return next(c for c in summary[kind] if c["hosts"] == hosts)
    return summary[name]


def quietest(runs: list) -> dict:
    """Each part from the run in which other work took the fewest cores (the machine is shared):
    the summary of several runs of this script, each part saying which run it is from."""
    out = {"commit": runs[0]["commit"], "other_cores": {}, "part_generated": {}, "unshaped": [], "shaped": [],
           "striped": []}
    names = list(dict.fromkeys(name for r in runs for name in r.get("other_cores", {})))
    for name in names:
        best = min((r for r in runs if name in r.get("other_cores", {})), key=lambda r: r["other_cores"][name])
        out["other_cores"][name] = best["other_cores"][name]
        out["part_generated"][name] = best["generated"]
        if name.startswith("unshaped-h"):
            data = part_data(best, name)
            if not data.get("gloo"):  # Gloo beside it from the quietest run that has it
                with_gloo = [r for r in runs if name in r.get("other_cores", {}) and part_data(r, name).get("gloo")]
                if with_gloo:
                    gloo_run = min(with_gloo, key=lambda r: r["other_cores"][name])
                    data = dict(data, gloo=part_data(gloo_run, name)["gloo"],
                                gloo_other_cores=gloo_run["other_cores"][name])
            out["unshaped"].append(data)
        elif name.startswith("shaped-h"):
            out["shaped"].append(part_data(best, name))
        elif name.startswith("striped-h"):
            out["striped"].append(part_data(best, name))
        else:
            out[name] = part_data(best, name)
    out["generated"] = max(out["part_generated"].values())
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", default="2,4,8,16,32")
    parser.add_argument("--mid-ranks", default="8,16,32")
    parser.add_argument("--hosts", default="2,4,8,16")
    parser.add_argument("--striped-hosts", default=STRIPED_HOSTS)
    parser.add_argument("--parts", default="one_host,unshaped,shaped,striped",
                        help="which parts to measure (default all): one_host, unshaped, shaped, striped")
    parser.add_argument("--quietest", nargs="+", metavar="SUMMARY",
                        help="measure nothing: write the summary of these runs' quietest parts")
    args = parser.parse_args()
    if args.quietest:
        summary = quietest([json.loads(Path(p).read_text()) for p in args.quietest])
        SUMMARY.write_text(json.dumps(summary, indent=2) + "\n")
        print(json.dumps(summary["other_cores"], indent=2))
        return 0
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    summary = {"generated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                        cwd=REPO_ROOT).stdout.strip(),
               "other_cores": {}}

    def part(name, run):
        with OtherLoad() as other:
            out = run()
        summary["other_cores"][name] = round(other.cores, 3)
        return out

    parts = set(args.parts.split(","))
    if "one_host" in parts:
        summary["one_host_small"] = part("one_host_small", lambda: one_host(args.ranks, "8,1K", "one_host_small"))
        summary["one_host_mid"] = part("one_host_mid", lambda: one_host(args.mid_ranks, "64K,256K", "one_host_mid"))
        summary["one_host_large"] = part("one_host_large", lambda: one_host("4", "64M", "one_host_large"))
    if "unshaped" in parts:
        summary["unshaped"] = [part(f"unshaped-h{h}", lambda h=h: unshaped(int(h))) for h in args.hosts.split(",")]
    if "shaped" in parts:
        summary["shaped"] = [part(f"shaped-h{SHAPED_HOSTS}", lambda: shaped(SHAPED_HOSTS, SHAPED_RATE))]
    if "striped" in parts:
        summary["striped"] = [part(f"striped-h{h}", lambda h=h: striped(int(h), STRIPED_RATE))
                              for h in args.striped_hosts.split(",")]
    text = json.dumps(summary, indent=2) + "\n"
    runs = OUT_DIR / "runs"
    runs.mkdir(exist_ok=True)
    run_path = runs / f"run-{datetime.datetime.now(datetime.timezone.utc):%H%M}.json"
    run_path.write_text(text)
    if parts >= {"one_host", "unshaped", "shaped", "striped"}:
        SUMMARY.write_text(text)
    else:  # a partial run: the summary comes from merging it with whole runs
        print(f"{run_path}: some parts only; merge with --quietest {run_path} <other runs>", file=sys.stderr)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
