#!/usr/bin/env python3
"""Runs issue 20's JAX benchmark on the network-namespace testbed (4 hosts, two rails), as root:

    .venv/bin/python benchmarks/run_jax_bench.py [shaped,train,unshaped]

(1) both rails shaped to 1 Gbit/s: a jitted pytree allreduce 8 B - 64 MB, nezha.jax against
jax.distributed + gloo psum under jit on rail 0; (3) below; (2) unshaped rails: 8 B - 64 KB
latency, the same pair, one allreduce per jitted call and 50 in one (the collective's latency
inside jit); (3) a training step (7.3M-parameter MLP) with DistributedOptimizer against a gloo
pmean step, on the shaped rails; (4) `leaf`, on the shaped rails: one 64 MB array against the same
bytes as 8 x 8 MB leaves and numpy's one array, taking turns in 6 rounds (issue 39 point 4).
Prints each job's table; raw JSON and logs go to benchmarks/out/jax-*.
"""
import shlex
import subprocess
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
sys.path.insert(0, str(REPO))
OUT = BENCH_DIR / "out"


def run(testbed, key, sizes, extra=(), timeout_s=400):
    json_path = OUT / f"jax-{key}.json"
    # A later --leaves in `extra` overrides this one.
    job(testbed, key, ["jax_allreduce_bench.py", "--sizes", sizes, "--leaves", "8", "--baseline",
                       "gloo", "--json", str(json_path), *extra], timeout_s)


def job(testbed, key, script_args, timeout_s=400):
    log_path = OUT / f"jax-{key}.log"
    argv = [sys.executable, "-m", "nezha.runner", "-np", "4", *testbed.nezharun_args(), "--",
            sys.executable, str(BENCH_DIR / script_args[0]), *script_args[1:]]
    print("$", shlex.join(argv), flush=True)
    proc = subprocess.run(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout_s)
    log_path.write_text(proc.stdout)
    print("\n".join(l for l in proc.stdout.splitlines()
                    if l.startswith("[0]<stdout>:") and (" B " in l or "ms/step" in l)))
    if proc.returncode:
        print(f"{key}: exited {proc.returncode}; log {log_path}", flush=True)


def main():
    from nezha.testbed import Testbed, testbed_available
    ok, reason = testbed_available()
    if not ok:
        sys.exit(f"the testbed is not available: {reason}")
    OUT.mkdir(exist_ok=True)
    wanted = set((sys.argv[1] if len(sys.argv) > 1 else "shaped,train,unshaped").split(","))
    with Testbed(hosts=4, rails=2, rates=["1gbit", "1gbit"]) as testbed:
        if "shaped" in wanted:
            run(testbed, "shaped", "8,1K,64K,1M,16M,64M")
        if "leaf" in wanted:
            run(testbed, "leaf", "64M", ["--leaves", "1", "--tree-leaves", "8", "--iters", "24",
                                         "--large-rounds", "6", "--warmup", "2", "--baseline", "none"])
        if "train" in wanted:
            job(testbed, "train", ["jax_train_bench.py", "--width", "1024", "--depth", "4"])
        for rail in range(2):
            testbed.set_rate(rail, None)
        if "unshaped" in wanted:
            run(testbed, "unshaped", "8,1K,64K", ["--in-jit-loop", "50"])


if __name__ == "__main__":
    main()
