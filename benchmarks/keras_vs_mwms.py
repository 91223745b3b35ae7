#!/usr/bin/env python3
"""Issue 19 point 6 on the testbed (4 hosts, two 1 Gbit/s rails): samples/s of nezha.keras
(model.fit with DistributedOptimizer, examples/tensorflow2_keras_synthetic_benchmark.py) against
tf.distribute.MultiWorkerMirroredStrategy (RING over gRPC, benchmarks/mwms_synthetic_benchmark.py),
same models, per-worker batch and steps, in one run. Writes benchmarks/out/keras-vs-mwms.json and
prints a Markdown table for benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/keras_vs_mwms.py          # from the repository root, as root

nezha.keras runs on both rails and on rail 0; MWMS on rail 0 and on rail 1 (gRPC reaches each
worker at one address, so it cannot use two rails at once). Keras 3's model.fit fails under MWMS
(PerReplica inputs; keras issue 20585), so MWMS runs a tf.function loop with strategy.run.
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
sys.path[:0] = [str(BENCH_DIR), str(REPO_ROOT)]

from matrix_cases import replace_flag  # noqa: E402
from run_matrix import interface_tx_bytes, run_job  # noqa: E402
from train_matrix import bring_up  # noqa: E402

OUT_DIR = BENCH_DIR / "out"
RUN_TIMEOUT_S = 300
MWMS_PORT = 23900
WORKLOADS = (  # model, role, per-worker batch, image size
    ("mlp46m", "communication-heavy", 16, 32),
    ("convnet", "compute-heavy", 8, 64),
)
STEPS = ["--num-warmup-batches", "2", "--num-batches-per-iter", "3", "--num-iters", "3"]
# 4 ranks share 2 cores: one intra-op thread each for every implementation.
THREADS = {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "2",
           "TF_CPP_MIN_LOG_LEVEL": "2", "KERAS_BACKEND": "tensorflow"}


def log(message):
    print("[keras_vs_mwms %s] %s" % (time.strftime("%H:%M:%S"), message), flush=True)


def nezha_run(testbed, model, batch, image, rails, json_path, log_path):
    subnets = ",".join(testbed.rail_subnets[r] for r in rails)
    argv = [sys.executable, "-m", "nezha.runner", "-np", str(len(testbed.hosts)),
            *replace_flag(testbed.nezharun_args(), "--rails", subnets), "--",
            sys.executable, str(REPO_ROOT / "examples/tensorflow2_keras_synthetic_benchmark.py"),
            "--model", model, "--batch-size", str(batch), "--image-size", str(image), *STEPS,
            "--json", str(json_path)]
    os.environ.update(THREADS)
    error = run_job(argv, log_path, RUN_TIMEOUT_S)
    if error:
        return {"error": error}
    result = json.loads(json_path.read_text())
    return {"samples_s": result["img_sec_per_rank"] * result["ranks"], "command": " ".join(argv)}


def mwms_run(testbed, model, batch, image, rail, json_path, log_path, port):
    workers = ["%s:%d" % (testbed.host_addr(h, rail), port) for h in range(len(testbed.hosts))]
    procs = []
    with open(log_path, "w") as out:
        for index, host in enumerate(testbed.hosts):
            env = dict(os.environ, **THREADS, TF_CONFIG=json.dumps(
                {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}))
            argv = [sys.executable, str(BENCH_DIR / "mwms_synthetic_benchmark.py"), "--model",
                    model, "--batch-size", str(batch), "--image-size", str(image), *STEPS,
                    "--loop", "custom", "--json", str(json_path)]
            procs.append(testbed.popen(host, argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                       cwd=REPO_ROOT))
        deadline = time.monotonic() + RUN_TIMEOUT_S
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=max(1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append("timeout")
    if any(c != 0 for c in codes):
        return {"error": "exit codes %s (log %s)" % (codes, log_path)}
    result = json.loads(json_path.read_text())
    others = [json.loads(Path("%s.%d" % (json_path, i)).read_text())["checksum"]
              for i in range(1, len(procs))]
    if any(abs(c - result["checksum"]) > 1e-6 * max(1.0, abs(c)) for c in others):
        return {"error": "workers' weights differ: gradients were not all-reduced"}
    return {"samples_s": result["img_sec_per_rank"] * result["ranks"],
            "command": "ip netns exec HOST TF_CONFIG=... " + " ".join(argv)}


def main():
    from nezha.testbed import Testbed, testbed_available
    ok, reason = testbed_available()
    if not ok:
        raise SystemExit("keras_vs_mwms: the testbed is not available: %s" % reason)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    testbed = bring_up(Testbed, "nzk")
    results = []
    try:
        port = MWMS_PORT
        for model, role, batch, image in WORKLOADS:
            runs = [("nezha.keras, 2 rails", lambda j, l: nezha_run(testbed, model, batch, image,
                                                                      (0, 1), j, l)),
                    ("nezha.keras, rail 0", lambda j, l: nezha_run(testbed, model, batch, image,
                                                                     (0,), j, l)),
                    ("MWMS, rail 0", lambda j, l: mwms_run(testbed, model, batch, image, 0, j, l,
                                                           port)),
                    ("MWMS, rail 1", lambda j, l: mwms_run(testbed, model, batch, image, 1, j, l,
                                                           port + 1))]
            port += 2
            for label, run in runs:
                stem = "keras-vs-mwms-%s-%s" % (model, label.replace(" ", "").replace(",", "-"))
                before = interface_tx_bytes(testbed)
                started = time.monotonic()
                entry = run(OUT_DIR / (stem + ".json"), OUT_DIR / (stem + ".log"))
                entry.update(model=model, role=role, run=label, wall_s=time.monotonic() - started,
                             traffic=[a - b for a, b in zip(interface_tx_bytes(testbed), before)])
                log("%s %s: %s" % (model, label, entry.get("samples_s", entry.get("error"))))
                results.append(entry)
    finally:
        testbed.down()
    (OUT_DIR / "keras-vs-mwms.json").write_text(json.dumps(results, indent=2))
    print("| model | run | samples/s | bytes sent per rail (MB) |\n|---|---|---|---|")
    for e in results:
        figure = "%.1f" % e["samples_s"] if "samples_s" in e else "failed: %s" % e["error"]
        print("| %s (%s) | %s | %s | %s |" % (e["model"], e["role"], e["run"], figure,
                                           " / ".join("%.0f" % (t / 1e6) for t in e["traffic"])))


if __name__ == "__main__":
    main()
