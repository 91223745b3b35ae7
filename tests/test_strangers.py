"""Strangers connecting to every listening port of a running job (rendezvous store, control and
data listeners) are refused and never disturb it."""
import os
import socket
import subprocess
import sys
import threading
import time

import psutil

from conftest import REPO, WORKERS


def listening_ports(root_pid):
    procs = [psutil.Process(root_pid)] + psutil.Process(root_pid).children(recursive=True)
    ports = set()
    for p in procs:
        try:
            conns = p.net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        ports.update((c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN)
    return sorted(ports)


def test_strangers_on_every_port_do_not_disturb_the_job():
    cmd = [sys.executable, "-m", "nezha.runner.launch", "-np", "3", "--", sys.executable,
           str(WORKERS / "steady_allreduce.py"), "4"]
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "NEZHA_TIMEOUT_S": "20"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, ready = [], threading.Event()

    def collect():
        for line in proc.stdout:
            lines.append(line)
            if sum("READY" in l for l in lines) == 3:
                ready.set()

    reader = threading.Thread(target=collect, daemon=True)
    reader.start()
    held = []
    try:
        assert ready.wait(60), "".join(lines)
        ports = listening_ports(proc.pid)
        # 1 store + per rank a control and a data listener.
        assert len(ports) >= 1 + 3 * 2, ports
        for addr, port in ports:
            garbage = socket.create_connection((addr, port), timeout=5)
            garbage.sendall(os.urandom(4096))
            held.append(garbage)
            held.append(socket.create_connection((addr, port), timeout=5))  # silent
            fake = socket.create_connection((addr, port), timeout=5)
            fake.sendall(b"NZH1" + bytes([2, 1, 0, 0]) + (64).to_bytes(8, "little") * 2 +
                         bytes(40) + os.urandom(64))
            held.append(fake)
        proc.wait(timeout=90)
    finally:
        for s in held:
            s.close()
        if proc.poll() is None:
            proc.kill()
        reader.join(5)
    out = "".join(lines)
    assert proc.returncode == 0, out[-3000:]
    for r in range(3):
        assert f"[{r}]<stdout>: OK rank {r}" in out, out[-3000:]
