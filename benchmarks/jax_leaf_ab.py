#!/usr/bin/env python3
"""The JAX leaf job (one 64 MB array, the same bytes as 8 leaves, numpy's one array) from several
checkouts in turns, in one testbed session (4 hosts, two rails shaped to 1 Gbit/s), as root:

    .venv/bin/python benchmarks/jax_leaf_ab.py --out DIR --turns 6 before=/path/a after=/path/b

Each checkout runs with its own .venv; the order alternates every turn so both see the same
machine. --timeline also writes each job's NEZHA_TIMELINE traces (benchmarks/balance_tail.py reads
them). Prints rank 0's table per job; JSON and logs go to DIR.
"""
import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkouts", nargs="+", metavar="NAME=DIR")
    parser.add_argument("--out", required=True)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--timeline", action="store_true")
    args = parser.parse_args()
    checkouts = [(c.split("=", 1)[0], Path(c.split("=", 1)[1]).resolve()) for c in args.checkouts]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from nezha.testbed import Testbed, testbed_available
    ok, reason = testbed_available()
    if not ok:
        sys.exit(f"the testbed is not available: {reason}")
    with Testbed(hosts=4, rails=2, rates=["1gbit", "1gbit"]) as testbed:
        for turn in range(args.turns):
            for key, repo in (checkouts if turn % 2 == 0 else checkouts[::-1]):
                py = str(repo / ".venv/bin/python")
                argv = [py, "-m", "nezha.runner", "-np", "4", *testbed.nezharun_args(), "--", py,
                        str(repo / "benchmarks/jax_allreduce_bench.py"), "--sizes", "64M", "--leaves", "1",
                        "--tree-leaves", "8", "--iters", "24", "--large-rounds", "6", "--warmup", "2",
                        "--baseline", "none", "--json", str(out / f"{key}-{turn}.json")]
                env = dict(os.environ)
                if args.timeline:
                    env["NEZHA_TIMELINE"] = str(out / f"{key}-{turn}.{{rank}}.json")
                load = open("/proc/loadavg").read().split()[0]
                start = time.time()
                proc = subprocess.run(argv, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, timeout=600)
                (out / f"{key}-{turn}.log").write_text(proc.stdout)
                lines = [l for l in proc.stdout.splitlines() if l.startswith("[0]<stdout>:") and " B " in l]
                print(f"turn {turn} {key}: load {load}, exit {proc.returncode}, {time.time() - start:.0f} s",
                      *lines, sep="\n  ", flush=True)


if __name__ == "__main__":
    main()
