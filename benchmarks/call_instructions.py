"""Instructions one rank executes per small allreduce, by job size: whether a call's own work grows
with the job. Time cannot tell on this machine (128 processes on 2 cores: scheduling and cold
caches vary from run to run, and the VM exposes no hardware counters); valgrind's callgrind counts
instructions, the same for the same code path whatever else runs.

For each job size it runs `benchmarks/small_op_cpu.py` under `nezharun -np N` twice, with the
chosen rank under callgrind, for two numbers of calls, and reports the difference of the two totals
over the difference of the calls: start-up, imports and shutdown cancel out. The rank under
valgrind runs ~20x slower, so the job goes at its pace; the counts do not depend on that.

    .venv/bin/python benchmarks/call_instructions.py --ranks 32,128            # a worker (rank 5)
    .venv/bin/python benchmarks/call_instructions.py --ranks 32,128 --rank 0   # the coordinator
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

WRAPPER = """#!/bin/sh
if [ "$NEZHA_RANK" = "$CI_RANK" ]; then
  exec valgrind --tool=callgrind --callgrind-out-file="$CI_OUT" "$@"
fi
exec "$@"
"""


def total_instructions(ranks, rank, calls, workdir, timeout_s):
    out = os.path.join(workdir, f"callgrind.{ranks}.{calls}")
    env = dict(os.environ, CI_RANK=str(rank), CI_OUT=out, N=str(calls))
    wrapper = os.path.join(workdir, "under_callgrind.sh")
    cmd = [os.path.join(os.path.dirname(sys.executable), "nezharun"), "-np", str(ranks), wrapper,
           sys.executable, os.path.join(HERE, "small_op_cpu.py")]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    if run.returncode != 0:
        raise SystemExit(f"{ranks} ranks, {calls} calls failed (exit {run.returncode}):\n{run.stderr[-2000:]}")
    with open(out) as f:
        for line in f:
            m = re.match(r"totals:\s+(\d+)", line)
            if m:
                return int(m.group(1))
    raise SystemExit(f"no totals in {out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="32,128", help="job sizes, comma-separated")
    ap.add_argument("--rank", type=int, default=5, help="the rank counted (0: the coordinator)")
    ap.add_argument("--calls", default="500,2500", help="the two call counts")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per job")
    ap.add_argument("--json", help="write the records here")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    few, many = (int(c) for c in args.calls.split(","))
    records = []
    with tempfile.TemporaryDirectory(prefix="nezha-callgrind-") as workdir:
        wrapper = os.path.join(workdir, "under_callgrind.sh")
        with open(wrapper, "w") as f:
            f.write(WRAPPER)
        os.chmod(wrapper, 0o755)
        for ranks in (int(r) for r in args.ranks.split(",")):
            a = total_instructions(ranks, args.rank, few, workdir, args.timeout)
            b = total_instructions(ranks, args.rank, many, workdir, args.timeout)
            per_call = (b - a) / (many - few)
            records.append({"ranks": ranks, "rank": args.rank, "instructions_per_call": round(per_call)})
            print(f"{ranks} ranks: rank {args.rank} executes {per_call / 1000:.1f}k instructions per 8 B allreduce",
                  flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
