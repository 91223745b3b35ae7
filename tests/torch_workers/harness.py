"""Runs a torch worker script on N ranks under nezharun and checks that every rank passed.

Workers print one `PASS <check>` line per check and exit non-zero on the first failure; the
launcher's exit code and the PASS lines of every rank are both asserted, so a worker that silently
skips checks fails the test.
"""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def run_workers(script, num_ranks=2, timeout_s=120, args=(), env=None, workers_dir=HERE):
    """Returns the combined output; raises AssertionError (with the output) on failure/timeout."""
    cmd = [sys.executable, "-m", "nezha.runner.launch", "-np", str(num_ranks),
           sys.executable, os.path.join(workers_dir, script), *args]
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = REPO + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.setdefault("NEZHA_TIMEOUT_S", "20")
    full_env.update(env or {})
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=full_env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError("%s did not finish in %ds:\n%s" % (script, timeout_s, exc.output))
    assert proc.returncode == 0, "%s exited %d:\n%s" % (script, proc.returncode, proc.stdout)
    return proc.stdout


def say(line):
    """Prints one line in one write, so no other process's output lands inside it (workers share
    the launcher's pipe)."""
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), (line + "\n").encode())


def assert_every_rank_passed(output, num_ranks, expected):
    """Every rank reported every check in `expected` as passed.

    Searched for as text, not as whole lines: ranks share one pipe, and another process's stderr
    (a FutureWarning) may land between a PASS message and its newline."""
    for rank in range(num_ranks):
        missing = {check for check in expected if "PASS[%d] %s" % (rank, check) not in output}
        assert not missing, "rank %d did not pass %s:\n%s" % (rank, sorted(missing), output)
