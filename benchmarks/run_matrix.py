#!/usr/bin/env python3
"""Runs the benchmark matrix of issue #3 on the network-namespace testbed and writes
benchmarks/RESULTS.md and benchmarks/busbw.png (raw JSON and logs in benchmarks/out/).

    sudo .venv/bin/python benchmarks/run_matrix.py [--quick]     # from the repository root, as root

Cases: (a) two 1 Gbit/s rails, (b) 1 Gbit/s + 250 Mbit/s, each with nezha on both rails, on each
rail alone, in MPTCP mode, and Gloo on one and on both interfaces; (c) unshaped rails: small-message
latency and 64 MB, nezha against Gloo. The testbed comes down at the end, also on errors and Ctrl-C.
"""
from __future__ import annotations

import argparse
import datetime
import json
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
if str(REPO_ROOT) not in sys.path:  # `python benchmarks/run_matrix.py` puts only benchmarks/ on the path
    sys.path.append(str(REPO_ROOT))

from matrix_cases import Case, Run, build_cases, loopback_case, run_command  # noqa: E402
from matrix_report import CaseResult, render_results  # noqa: E402

OUT_DIR = BENCH_DIR / "out"
HOSTS, RAILS = 4, 2
# Wall-clock bounds: per nezharun job, and for the whole matrix (later runs are skipped, and say so).
RUN_TIMEOUT_S = {"quick": 90.0, "full": 240.0}
MATRIX_BUDGET_S = {"quick": 180.0, "full": 900.0}
STOP_GRACE_S = 15.0


def log(message: str) -> None:
    print(f"[run_matrix {time.strftime('%H:%M:%S')}] {message}", flush=True)


def run_job(argv: List[str], log_path: Path, timeout_s: float) -> Optional[str]:
    """Runs one nezharun job with output to `log_path`; returns None or what went wrong."""
    with open(log_path, "w", encoding="utf-8") as out:
        out.write("$ " + shlex.join(argv) + "\n")
        out.flush()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stop(proc)
            return f"timed out after {timeout_s:.0f} s (log {log_path})"
        except BaseException:
            stop(proc)
            raise
    if code != 0:
        tail = log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-5:]
        return f"exit code {code} (log {log_path}): " + " / ".join(line.strip() for line in tail)
    return None


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM lets nezharun stop its ranks cleanly; SIGKILL if it does not within the grace."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=STOP_GRACE_S)


def interface_tx_bytes(testbed) -> List[int]:
    """Bytes sent per rail interface, summed over hosts: what really crossed each rail, whichever
    implementation sent it (nezha's own counters cannot see MPTCP subflows or Gloo)."""
    totals = [0] * testbed.rails
    for host in testbed.hosts:
        for rail in range(testbed.rails):
            out = subprocess.run(["ip", "-j", "-s", "-n", host, "link", "show", "dev", testbed.interface(rail)],
                                 capture_output=True, text=True, timeout=10, check=True).stdout
            totals[rail] += int(json.loads(out)[0]["stats64"]["tx"]["bytes"])
    return totals


def run_case(testbed, case: Case, quick: bool, deadline: float) -> CaseResult:
    """One case's runs; `testbed` None runs them on this machine's loopback."""
    from nezha.bench.records import read_json

    result = CaseResult(case)
    for rail, rate in enumerate(case.rates if testbed else ()):
        testbed.set_rate(rail, rate)
    log(f"case ({case.key}) {case.title}: " + ", ".join(f"rail{i} {r}" for i, r in enumerate(case.rates)))
    for run in case.runs:
        stem = f"{case.key}-{run.key}"
        json_path, log_path = OUT_DIR / f"{stem}.json", OUT_DIR / f"{stem}.log"
        json_path.unlink(missing_ok=True)
        argv = run_command(run, case, testbed.nezharun_args() if testbed else [], str(json_path),
                           quick)
        result.commands.append(shlex.join(argv))
        left = deadline - time.monotonic()
        if left < 10:
            result.errors.append(f"{stem}: skipped, the matrix's time budget is spent")
            log(f"  {stem}: skipped (time budget spent)")
            continue
        started = time.monotonic()
        mode = "quick" if quick else "full"
        tx_before = interface_tx_bytes(testbed) if testbed else []
        error = run_job(argv, log_path, min(RUN_TIMEOUT_S[mode], left))
        took = time.monotonic() - started
        if testbed:
            result.traffic[run.key] = [after - before for after, before in
                                       zip(interface_tx_bytes(testbed), tx_before)]
        if error is None and not json_path.exists():
            error = f"no JSON written (log {log_path})"
        if error:
            result.errors.append(f"{stem}: {error}")
            log(f"  {stem}: FAILED after {took:.0f} s: {error}")
            continue
        records = read_json(str(json_path))
        result.records.extend(records)
        largest = max(records, key=lambda r: r.bytes)
        figures = ", ".join(f"{r.impl} {r.busbw_gbps:.2f}" for r in records if r.bytes == largest.bytes)
        log(f"  {stem}: {took:.0f} s; busbw at {largest.bytes} B (Gbit/s): {figures}")
    return result


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes, 5 iterations (about 3 minutes)")
    parser.add_argument("--prefix", default="nzbench", help="testbed name prefix (default nzbench)")
    parser.add_argument("--cases", default="a,b,c,d",
                        help="comma list of cases to run (default a,b,c,d; d = loopback)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from nezha.testbed import Testbed, testbed_available

    ok, reason = testbed_available()
    if not ok:
        print(f"run_matrix: the testbed is not available: {reason}", file=sys.stderr)
        return 2
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    wanted = {key.strip() for key in args.cases.split(",") if key.strip()}
    mode = "quick" if args.quick else "full"
    started_at = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    start = time.monotonic()
    deadline = start + MATRIX_BUDGET_S[mode]
    results: List[CaseResult] = []
    if "d" in wanted:
        results.append(run_case(None, loopback_case(args.quick), args.quick, deadline))
    log(f"bringing up the testbed: {HOSTS} hosts, {RAILS} rails, prefix {args.prefix}")
    with Testbed(hosts=HOSTS, rails=RAILS, rates=["1gbit", "1gbit"], prefix=args.prefix) as testbed:
        for case in build_cases(testbed.rail_subnets, args.quick):
            if case.key in wanted:
                results.append(run_case(testbed, case, args.quick, deadline))
        log("bringing the testbed down")
    duration = time.monotonic() - start
    testbed_text = (f"{HOSTS} network namespaces, {RAILS} rails (veth + bridge, tc tbf shaping), "
                    f"launched with nezharun --launcher 'ip netns exec {{host}}'")
    text = render_results(results, quick=args.quick, started=started_at, duration_s=duration,
                          testbed=testbed_text)
    # Hand-written analysis (gaps and their causes) and the training figures stay with the numbers.
    for extra in ("ANALYSIS.md", "TRAINING.md", "FAILOVER.md", "JAX.md", "TENSORFLOW.md", "SHM.md", "OFI.md",
                  "AGG.md", "STRIPED.md", "BALANCE.md", "HOROVOD_TESTS.md"):
        if (BENCH_DIR / extra).exists():
            section = (BENCH_DIR / extra).read_text(encoding="utf-8")
            text += "\n\n" + ("#" + section if section.startswith("# ") else section)
    (BENCH_DIR / "RESULTS.md").write_text(text, encoding="utf-8")
    from busbw_plot import write_plot
    write_plot(results, str(BENCH_DIR / "busbw.png"))
    log(f"wrote {BENCH_DIR / 'RESULTS.md'} and {BENCH_DIR / 'busbw.png'} in {duration:.0f} s")
    failed = sum(len(res.errors) for res in results)
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("run_matrix: interrupted; the testbed was brought down", file=sys.stderr)
        sys.exit(130)
