"""Failover drill on the netns testbed: cut one host's cable to a rail during a continuous
allreduce (or another collective, --op), restore it, and measure the stall and the time to
re-admit the rail.

    python -m nezha.bench.failover_drill --cycles 10          (root; builds its own testbed)

Stall of a cut: the longest gap between consecutive completions from the last one before the cut
until 1 s after the restore, minus the median gap before the cut (the normal operation time). Re-admission: from restoring the
cable to the moment rank 0 reports the rail "up" again.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

WORKER = Path(__file__).resolve().parent / "failover_worker.py"


def run_drill(tb, cycles: int = 1, rail: int = 1, host: int = 1, down_s: float = 3.0,
              up_s: float = 6.0, elements: int = 1 << 20, timeout_s: float = 300,
              env: Optional[dict] = None, fault: str = "cut", rate: str = "1gbit",
              rails: Optional[str] = None, op: str = "allreduce", end_while_down: bool = False) -> dict:
    """Runs the drill on an up Testbed `tb`; returns per-cycle figures and every rank's output.

    fault "cut" pulls the cable; "throttle" shapes the host's egress on the rail to 8 kbit/s and
    back to `rate`; "reset" kills the host's TCP connections on the rail (`ss -K`: the peers get a
    reset) and re-admission is timed from the reset itself. `rails` replaces the testbed's rail spec
    (e.g. "10.50.0.0/24,ofi:tcp;ofi_rxm@10.51.0.0/24"), one item per testbed rail in rail order.
    `op`: the collective run back to back (failover_worker.py), `elements` float32 per rank.
    `end_while_down`: the job ends `down_s` after the last fault, before it is undone (a job shut
    down with the rail failed); that cycle has no restore."""
    stop_file = Path(tempfile.mkdtemp(prefix="nezha-drill-")) / "stop"
    launch_args = tb.nezharun_args()
    if rails is not None:
        launch_args[launch_args.index("--rails") + 1] = rails
    cmd = [sys.executable, "-m", "nezha.runner.launch", "-np", str(len(tb.hosts)), *launch_args,
           "--", sys.executable, str(WORKER), str(stop_file), str(rail), str(elements), op]
    full_env = {**os.environ, "NEZHA_TIMEOUT_S": "20", **(env or {})}
    proc = subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list = []
    ready = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if "READY" in line:
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    cuts, restores = [], []
    try:
        if not ready.wait(120):
            raise RuntimeError("drill job did not start:\n" + "\n".join(lines[-40:]))
        time.sleep(2.0)  # steady state first: the normal operation time
        for _ in range(cycles):
            cuts.append(time.monotonic())
            if fault == "cut":
                tb.set_link(rail, False, host=host)
            elif fault == "throttle":
                tb.set_rate(rail, "8kbit", host=host)
            else:
                tb.exec(host, ["ss", "-K", "dst", tb.rail_subnets[rail]], check=True, capture_output=True)
                restores.append(cuts[-1])  # nothing to restore: the rail may come back at once
            time.sleep(down_s)
            if end_while_down and len(cuts) == cycles:
                break
            if fault == "cut":
                tb.set_link(rail, True, host=host)
            elif fault == "throttle":
                tb.set_rate(rail, rate, host=host)
            if fault != "reset":
                restores.append(time.monotonic())
            time.sleep(up_s)
        stop_file.touch()
        proc.wait(timeout=timeout_s)
    finally:
        if tb.link_is_up(rail, host) is False:
            tb.set_link(rail, True, host=host)
        if fault == "throttle" and len(restores) < len(cuts):
            tb.set_rate(rail, rate, host=host)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(5)
    output = "\n".join(lines)
    reports = {}
    for line in lines:
        if "DRILL " in line:
            rec = json.loads(line.split("DRILL ", 1)[1])
            reports[rec["rank"]] = rec
    result = {"returncode": proc.returncode, "output": output, "cuts": cuts, "restores": restores,
              "reports": reports, "cycles": []}
    if 0 not in reports:
        return result
    done = reports[0]["completions"]
    gaps_before = [b - a for a, b in zip(done, done[1:]) if b < cuts[0]]
    normal = statistics.median(gaps_before) if gaps_before else 0.0
    ups = [t for t, s in reports[0]["transitions"] if s == "up"]
    for cut, restore in zip(cuts, restores):
        # The longest gap from the cut until 1 s after the restore, however long: a job frozen
        # until the cable came back must show as a stall of the whole cut (a window of 2 s after
        # the cut once hid exactly that).
        before = [t for t in done if t <= cut][-1:]
        during = [t for t in done if cut < t <= restore + 1.0]
        after = [t for t in done if t > restore + 1.0][:1]
        times = before + during + after
        gaps = [b - a for a, b in zip(times, times[1:])]
        stall = max(gaps) - normal if gaps else float("nan")
        back = [t - restore for t in ups if t >= restore]
        result["cycles"].append({"stall_s": stall, "readmit_s": back[0] if back else float("nan")})
    result["normal_op_s"] = normal
    return result


def summarize(cycles: list) -> dict:
    stalls = [c["stall_s"] for c in cycles]
    readmits = [c["readmit_s"] for c in cycles]
    return {"trials": len(cycles),
            "stall_median_ms": 1e3 * statistics.median(stalls), "stall_max_ms": 1e3 * max(stalls),
            "readmit_median_s": statistics.median(readmits), "readmit_max_s": max(readmits)}


def main(argv=None) -> int:
    from nezha.testbed import Testbed

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cycles", type=int, default=10)
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--rate", default="1gbit", help="rate of both rails")
    p.add_argument("--elements", type=int, default=1 << 20, help="float32 elements per rank and operation")
    p.add_argument("--op", default="allreduce",
                   choices=["allreduce", "allgather", "broadcast", "reducescatter", "alltoall"],
                   help="the collective run back to back (each striped over both rails)")
    p.add_argument("--down-s", type=float, default=3.0)
    p.add_argument("--up-s", type=float, default=6.0)
    p.add_argument("--fault", choices=["cut", "throttle", "reset"], default="cut",
                   help="pull the cable, shape the rail to 8 kbit/s, or reset its connections")
    p.add_argument("--rail", type=int, default=1, help="the rail to fail (0 also carries a control path)")
    p.add_argument("--rails", default=None,
                   help="rail spec instead of the testbed's two TCP rails, {0} and {1} standing for the "
                        "rails' subnets, e.g. '{0},ofi:tcp;ofi_rxm@{1}'")
    args = p.parse_args(argv)
    with Testbed(hosts=args.hosts, rails=2, rates=[args.rate, args.rate]) as tb:
        rails = args.rails.format(*tb.rail_subnets) if args.rails else None
        r = run_drill(tb, cycles=args.cycles, down_s=args.down_s, up_s=args.up_s, elements=args.elements,
                      fault=args.fault, rate=args.rate, rail=args.rail, rails=rails, op=args.op)
    if r["returncode"] != 0 or not r["cycles"]:
        print(r["output"][-4000:])
        return 1
    s = summarize(r["cycles"])
    print(f"normal op {r['normal_op_s'] * 1e3:.1f} ms; per cycle: " +
          ", ".join(f"stall {c['stall_s'] * 1e3:.0f} ms / readmit {c['readmit_s']:.2f} s" for c in r["cycles"]))
    print(json.dumps(s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
