"""``nezharun --aggregator HOST[@ADDR][:PORT]``: one ``nezha-aggd`` for the job, started on HOST the
way ranks are started there (the ``--launcher`` prefix, or ssh), and the rail ``agg:ADDR:PORT``
added to the job's rails. ADDR is the address ranks reach the daemon at (default: HOST resolved).

The daemon's key is the job secret, hex-encoded: the ranks' agg rails fall back to it when
``NEZHA_AGG_SECRET`` is not set, so no second secret travels. Like the job secret it never appears on
a command line: the environment carries it to a local or prefixed daemon, stdin to an ssh one.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from typing import List, Mapping, Optional

from nezha.runner.commands import SSH_LAUNCHER
from nezha.runner.hosts import is_local_host

DEFAULT_PORT = 7219
AGG_SECRET_VAR = "NEZHA_AGG_SECRET"


@dataclasses.dataclass(frozen=True)
class AggregatorSpec:
    host: str
    addr: str
    port: int

    @property
    def rail(self) -> str:
        return f"agg:{self.addr}:{self.port}"


def parse_aggregator(text: str) -> AggregatorSpec:
    """``HOST[@ADDR][:PORT]``; ``ValueError`` says what is wrong."""
    head, colon, port_text = text.rpartition(":")
    if not colon:
        head, port_text = text, str(DEFAULT_PORT)
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"--aggregator {text!r}: port {port_text!r} is not in 1..65535")
    host, _, addr = head.partition("@")
    if not host:
        raise ValueError(f"--aggregator {text!r}: expected HOST[@ADDR][:PORT]")
    if not addr:
        try:
            addr = socket.gethostbyname("127.0.0.1" if is_local_host(host) else host)
        except OSError as exc:
            raise ValueError(f"--aggregator {text!r}: cannot resolve {host}: {exc}; "
                             "give its address as HOST@ADDR") from None
    return AggregatorSpec(host, addr, int(port_text))


def daemon_binary() -> str:
    """nezha-aggd next to this Python (the package installs it there), else on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "nezha-aggd")
    return beside if os.path.exists(beside) else (shutil.which("nezha-aggd") or "nezha-aggd")


def daemon_command(spec: AggregatorSpec, launcher: Optional[str], secret_hex: str,
                   base_env: Mapping[str, str]):
    """(argv, env, stdin bytes or None) that start the daemon on spec.host."""
    listen = ["--listen", f"0.0.0.0:{spec.port}"]
    env = dict(base_env)
    if launcher is not None or is_local_host(spec.host):
        prefix = (shlex.split(launcher.replace("{host}", shlex.quote(spec.host)))
                  if launcher is not None else [])
        env[AGG_SECRET_VAR] = secret_hex
        return prefix + [daemon_binary()] + listen, env, None
    remote = (f"IFS= read -r {AGG_SECRET_VAR} && export {AGG_SECRET_VAR} && exec nezha-aggd "
              f"{' '.join(shlex.quote(a) for a in listen)}")
    argv = shlex.split(SSH_LAUNCHER.replace("{host}", shlex.quote(spec.host))) + [remote]
    return argv, env, (secret_hex + "\n").encode()


class Aggregator:
    """The running daemon: started by ``__enter__`` (waits until it listens), stopped on exit."""

    def __init__(self, spec: AggregatorSpec, launcher: Optional[str], secret_hex: str,
                 base_env: Mapping[str, str], start_timeout_s: float = 20.0):
        self.spec = spec
        self._argv, self._env, self._stdin = daemon_command(spec, launcher, secret_hex, base_env)
        self._timeout = start_timeout_s
        self._proc: Optional[subprocess.Popen] = None

    def __enter__(self) -> "Aggregator":
        self._proc = subprocess.Popen(self._argv, env=self._env, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=False)
        if self._stdin:
            self._proc.stdin.write(self._stdin)
        self._proc.stdin.close()
        deadline = time.monotonic() + self._timeout
        line = b""
        # The daemon prints one line once it listens; anything else (exit, silence) is a failure.
        import selectors
        with selectors.DefaultSelector() as sel:
            sel.register(self._proc.stdout, selectors.EVENT_READ)
            while b"listening on" not in line:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(timeout=left):
                    self.__exit__(None, None, None)
                    raise RuntimeError(f"nezha-aggd on {self.spec.host} did not start listening "
                                       f"within {self._timeout:.0f} s")
                chunk = os.read(self._proc.stdout.fileno(), 4096)
                if not chunk:
                    code = self._proc.wait()
                    raise RuntimeError(f"nezha-aggd on {self.spec.host} exited with code {code} "
                                       "before listening (see its message above)")
                line += chunk
        return self

    def __exit__(self, *exc) -> None:
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._proc.stdout:
            self._proc.stdout.close()
        self._proc = None


def rails_with_aggregator(rails: Optional[str], spec: AggregatorSpec) -> str:
    """The job's rail spec with the aggregator's rail appended."""
    return f"{rails},{spec.rail}" if rails else spec.rail
