#!/usr/bin/env python3
"""Runs issue 20's JAX benchmark on the network-namespace testbed (4 hosts, two rails), as root:

    .venv/bin/python benchmarks/run_jax_bench.py

(1) both rails shaped to 1 Gbit/s: a jitted pytree allreduce 8 B - 64 MB, nezha.jax against
jax.distributed + gloo psum under jit on rail 0; (2) unshaped rails: 8 B - 64 KB latency, the same
pair. Prints each job's table; raw JSON and logs go to benchmarks/out/jax-*.
"""
import shlex
import subprocess
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
sys.path.insert(0, str(REPO))
OUT = BENCH_DIR / "out"


def run(testbed, key, sizes, timeout_s=400):
    json_path, log_path = OUT / f"jax-{key}.json", OUT / f"jax-{key}.log"
    argv = [sys.executable, "-m", "nezha.runner", "-np", "4", *testbed.nezharun_args(), "--", sys.executable,
            str(BENCH_DIR / "jax_allreduce_bench.py"), "--sizes", sizes, "--leaves", "8",
            "--baseline", "gloo", "--json", str(json_path)]
    print("$", shlex.join(argv), flush=True)
    proc = subprocess.run(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout_s)
    log_path.write_text(proc.stdout)
    print("\n".join(l for l in proc.stdout.splitlines() if l.startswith("[0]<stdout>:") and " B " in l))
    if proc.returncode:
        print(f"{key}: exited {proc.returncode}; log {log_path}", flush=True)


def main():
    from nezha.testbed import Testbed, testbed_available
    ok, reason = testbed_available()
    if not ok:
        sys.exit(f"the testbed is not available: {reason}")
    OUT.mkdir(exist_ok=True)
    with Testbed(hosts=4, rails=2, rates=["1gbit", "1gbit"]) as testbed:
        run(testbed, "shaped", "8,1K,64K,1M,16M,64M")
        for rail in range(2):
            testbed.set_rate(rail, None)
        run(testbed, "unshaped", "8,1K,64K")


if __name__ == "__main__":
    main()
