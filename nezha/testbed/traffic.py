"""A bounded TCP/MPTCP bulk transfer between two testbed hosts, to measure what a rail delivers.

The sink runs in one namespace and the source in another (`python -m nezha.testbed.traffic sink|send`);
the sink times from the first byte to EOF and reports back, so the rate is what actually arrived.
Every socket operation has a timeout and the transfer is bounded in both time and bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Optional

CHUNK_BYTES = 1 << 18
IO_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Transfer:
    bytes: int
    seconds: float

    @property
    def gbps(self) -> float:
        return self.bytes * 8 / self.seconds / 1e9 if self.seconds > 0 else 0.0


def _socket(mptcp: bool) -> socket.socket:
    proto = socket.IPPROTO_MPTCP if mptcp else socket.IPPROTO_TCP
    return socket.socket(socket.AF_INET, socket.SOCK_STREAM, proto)


def serve_once(bind: str, mptcp: bool, accept_timeout_s: float) -> None:
    """Accepts one connection, drains it and replies with {"bytes", "seconds"} as one JSON line."""
    # The listener stays open until the transfer ends: MPTCP subflows join through it.
    with _socket(mptcp) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((bind, 0))
        listener.listen(1)
        listener.settimeout(accept_timeout_s)
        print(f"READY {listener.getsockname()[1]}", flush=True)
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(IO_TIMEOUT_S)
            received, seconds = _drain(conn)
            conn.sendall((json.dumps({"bytes": received, "seconds": seconds}) + "\n").encode())


def _drain(conn: socket.socket) -> tuple:
    """Reads until EOF; returns (bytes, seconds from the first byte to the last)."""
    buf = bytearray(CHUNK_BYTES)
    received = 0
    first = last = None
    while True:
        n = conn.recv_into(buf)
        if n == 0:
            break
        last = time.monotonic()
        if first is None:
            first = last
        received += n
    return received, (last - first) if first is not None else 0.0


def send(to: str, port: int, seconds: float, max_bytes: int, mptcp: bool) -> Transfer:
    """Sends zeros for `seconds` or `max_bytes`, whichever comes first; returns what the sink measured."""
    payload = bytes(CHUNK_BYTES)
    with _socket(mptcp) as sock:
        sock.settimeout(IO_TIMEOUT_S)
        sock.connect((to, port))
        sent = 0
        stop_at = time.monotonic() + seconds
        while sent < max_bytes and time.monotonic() < stop_at:
            sock.sendall(payload[: min(CHUNK_BYTES, max_bytes - sent)])
            sent += min(CHUNK_BYTES, max_bytes - sent)
        sock.shutdown(socket.SHUT_WR)
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = sock.recv(4096)
            if not chunk:
                raise ConnectionError(f"sink {to}:{port} closed without reporting what it received")
            reply += chunk
    report = json.loads(reply)
    return Transfer(bytes=report["bytes"], seconds=report["seconds"])


def _package_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def measure(testbed, src, dst, to_addr: str, seconds: float = 2.0, max_bytes: int = 1 << 30,
            mptcp: bool = False, timeout_s: Optional[float] = None) -> Transfer:
    """Runs a sink on host dst and a source on host src (both inside the testbed) towards to_addr."""
    timeout_s = timeout_s if timeout_s is not None else seconds + 15.0
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [_package_root(), os.environ.get("PYTHONPATH")])))
    module = [sys.executable, "-m", "nezha.testbed.traffic"]
    # An MPTCP listener must accept joins on every rail's address, so it binds to all of them.
    bind = "0.0.0.0" if mptcp else to_addr
    sink = testbed.popen(dst, module + ["sink", "--bind", bind, "--accept-timeout", str(timeout_s)]
                         + (["--mptcp"] if mptcp else []),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        port = _await_ready(sink, timeout_s, f"traffic sink on {dst} ({to_addr})")
        source = testbed.exec(src, module + ["send", "--to", to_addr, "--port", str(port), "--seconds", str(seconds),
                                             "--max-bytes", str(max_bytes)] + (["--mptcp"] if mptcp else []),
                              capture_output=True, text=True, env=env, timeout=timeout_s)
        if source.returncode != 0:
            raise RuntimeError(f"traffic from {src} to {to_addr} failed: {source.stderr.strip()}")
        report = json.loads(source.stdout)
        return Transfer(bytes=report["bytes"], seconds=report["seconds"])
    finally:
        if sink.poll() is None:
            sink.kill()
        sink.communicate(timeout=IO_TIMEOUT_S)


def _await_ready(sink: subprocess.Popen, timeout_s: float, what: str) -> int:
    """The port from the sink's `READY <port>` line; raises if it exits or stays silent past timeout_s."""
    readable, _, _ = select.select([sink.stdout], [], [], timeout_s)
    line = sink.stdout.readline().split() if readable else []
    if len(line) != 2 or line[0] != "READY":
        sink.kill()
        _, stderr = sink.communicate()
        reason = stderr.strip() or f"no READY line within {timeout_s:g} s"
        raise RuntimeError(f"{what} did not start: {reason}")
    return int(line[1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nezha.testbed.traffic", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sink = sub.add_parser("sink", help="accept one connection and report what arrived")
    sink.add_argument("--bind", required=True)
    sink.add_argument("--accept-timeout", type=float, default=30.0)
    sink.add_argument("--mptcp", action="store_true")
    source = sub.add_parser("send", help="send for a bounded time/size and print the sink's report")
    source.add_argument("--to", required=True)
    source.add_argument("--port", type=int, required=True)
    source.add_argument("--seconds", type=float, default=2.0)
    source.add_argument("--max-bytes", type=int, default=1 << 30)
    source.add_argument("--mptcp", action="store_true")
    args = parser.parse_args(argv)
    if args.cmd == "sink":
        serve_once(args.bind, args.mptcp, args.accept_timeout)
    else:
        result = send(args.to, args.port, args.seconds, args.max_bytes, args.mptcp)
        print(json.dumps({"bytes": result.bytes, "seconds": result.seconds, "gbps": result.gbps}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
