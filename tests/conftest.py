"""Shared fixtures: launching real multi-process jobs with nezharun on this machine."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

import pytest

REPO = Path(__file__).resolve().parent.parent
WORKERS = Path(__file__).resolve().parent / "workers"


class JobResult:
    def __init__(self, returncode: int, output: str) -> None:
        self.returncode = returncode
        self.output = output

    def lines(self, rank: int, stream: str = "stdout") -> List[str]:
        prefix = f"[{rank}]<{stream}>: "
        return [l[len(prefix):] for l in self.output.splitlines() if l.startswith(prefix)]


def run_job(np_: int, argv: List[str], env: Optional[Dict[str, str]] = None,
            timeout: float = 120, nezharun_args: Optional[List[str]] = None) -> JobResult:
    """Runs `nezharun -np N argv...` and returns its exit code and combined output."""
    full_env = dict(os.environ)
    full_env.setdefault("NEZHA_TIMEOUT_S", "20")
    full_env.update(env or {})
    cmd = [sys.executable, "-m", "nezha.runner.launch", "-np", str(np_), *(nezharun_args or []),
           "--", *argv]
    proc = subprocess.run(cmd, cwd=REPO, env=full_env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)
    return JobResult(proc.returncode, proc.stdout)


def run_worker(np_: int, script: str, *args: str, **kwargs) -> JobResult:
    """Runs tests/workers/<script> under nezharun with np_ ranks."""
    return run_job(np_, [sys.executable, str(WORKERS / script), *args], **kwargs)


def launch_direct(np_: int, script: str, *args: str, env: Optional[Dict[str, str]] = None,
                  timeout: float = 120, wait_for: Optional[List[int]] = None,
                  hosts: Optional[List[str]] = None, rendezvous_addr: str = "127.0.0.1") -> List[JobResult]:
    """Runs np_ ranks of tests/workers/<script> without a supervisor (no fail-fast), serving the
    rendezvous store from this process; returns one JobResult per rank. With `wait_for`, the
    other ranks are killed once those have exited. `hosts` (one testbed namespace per rank) starts
    each rank with `ip netns exec HOST`, placed as nezharun would place them."""
    import secrets

    from nezha.rendezvous import StoreServer

    secret = secrets.token_bytes(16)
    server = StoreServer(rendezvous_addr, 0, secret).start()
    hosts = hosts or ["localhost"] * np_
    order = list(dict.fromkeys(hosts))
    procs = []
    try:
        for r in range(np_):
            e = {k: v for k, v in os.environ.items() if not k.startswith("NEZHA_")}
            e.update({"NEZHA_RANK": str(r), "NEZHA_SIZE": str(np_),
                      "NEZHA_LOCAL_RANK": str(hosts[:r].count(hosts[r])),
                      "NEZHA_LOCAL_SIZE": str(hosts.count(hosts[r])),
                      "NEZHA_CROSS_RANK": str(order.index(hosts[r])),
                      "NEZHA_CROSS_SIZE": str(len(order)), "NEZHA_HOST_ID": hosts[r],
                      "NEZHA_RENDEZVOUS_ADDR": rendezvous_addr,
                      "NEZHA_RENDEZVOUS_PORT": str(server.port), "NEZHA_SECRET": secret.hex()})
            e.update(env or {})
            prefix = [] if hosts[r] == "localhost" else ["ip", "netns", "exec", hosts[r]]
            procs.append(subprocess.Popen([*prefix, sys.executable, str(WORKERS / script), *args], cwd=REPO,
                                          env=e, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
        # The ranks waited for first (whatever their number), then the others, killed if still running.
        order = sorted(range(np_), key=lambda r: wait_for is not None and r not in wait_for)
        results = {}
        for r in order:
            p = procs[r]
            if wait_for is not None and r not in wait_for and p.poll() is None:
                p.kill()
            try:
                out = p.communicate(timeout=timeout)[0]
            except subprocess.TimeoutExpired:
                p.kill()
                out = p.communicate()[0] + "\n<killed by the test: timeout>"
            results[r] = JobResult(p.returncode, out)
        return [results[r] for r in range(np_)]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        server.stop()


def assert_victim_named(results: List[JobResult], victim: int, survivors: List[int],
                        within_s: float) -> None:
    """dead_peer.py's check: every survivor raised (exit 3) within `within_s` seconds naming the
    victim, and the victim was SIGKILLed."""
    for rank in survivors:
        res = results[rank]
        assert res.returncode == 3, res.output[-2000:]
        line = next(l for l in res.output.splitlines() if l.startswith("RAISED"))
        assert float(re.search(r"after (\S+)s", line).group(1)) < within_s, line
        assert f"rank {victim}" in line, line
    assert results[victim].returncode == -signal.SIGKILL


def run_example(*args, env: Optional[Dict[str, str]] = None, timeout_s: float = 150) -> str:
    """Runs `nezharun -np 2 python <args>` (an example script and its flags) from the repository
    root, asserts it exited 0 and returns its combined output."""
    cmd = [sys.executable, "-m", "nezha.runner", "-np", "2", sys.executable, *map(str, args)]
    proc = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout_s, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, "%s exited %d:\n%s" % (args[0], proc.returncode, proc.stdout)
    return proc.stdout

@pytest.fixture
def job():
    return run_worker


def pytest_configure(config):
    # The sanitizer tier (scripts/asan_python.sh) must really test the sanitized core.
    expected = os.environ.get("NEZHA_EXPECT_SANITIZED_CORE")
    if expected:
        import nezha._core
        loaded = os.path.realpath(nezha._core.__file__)
        if not os.path.dirname(os.path.abspath(nezha._core.__file__)) == os.path.abspath(expected):
            raise pytest.UsageError(f"nezha._core came from {loaded}, not the sanitized build in "
                                    f"{expected}")
