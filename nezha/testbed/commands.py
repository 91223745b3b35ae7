"""Run iproute2/tc/sysctl commands with a timeout; a failure names the command and its stderr."""

from __future__ import annotations

import subprocess
from typing import Optional, Sequence

DEFAULT_TIMEOUT_S = 10.0


class TestbedError(RuntimeError):
    """A testbed operation failed (the message names the command and what it printed)."""

    __test__ = False  # not a pytest test class despite the name


class CommandError(TestbedError):
    """A command exited non-zero or ran past its timeout."""

    def __init__(self, argv: Sequence[str], returncode: Optional[int], stderr: str, reason: str = ""):
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr
        what = reason or f"exit status {returncode}"
        detail = f": {stderr.strip()}" if stderr.strip() else ""
        super().__init__(f"`{' '.join(self.argv)}` failed ({what}){detail}")


def run(argv: Sequence[str], timeout: float = DEFAULT_TIMEOUT_S, check: bool = True) -> subprocess.CompletedProcess:
    """Runs argv (no shell), captures its output as text and raises CommandError on failure if check."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        raise CommandError(argv, None, stderr, reason=f"timed out after {timeout:g} s") from None
    except FileNotFoundError:
        raise CommandError(argv, None, "", reason=f"{argv[0]} is not installed") from None
    if check and done.returncode != 0:
        raise CommandError(argv, done.returncode, done.stderr)
    return done


def in_netns(namespace: Optional[str], argv: Sequence[str]) -> list:
    """argv prefixed so that it runs inside `namespace` (None: the root namespace)."""
    if namespace is None:
        return list(argv)
    return ["ip", "netns", "exec", namespace, *argv]
