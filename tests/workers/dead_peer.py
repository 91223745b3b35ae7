"""A rank dies (SIGKILL) or freezes (SIGSTOP) mid-run; every other rank must raise NezhaError
naming it within NEZHA_TIMEOUT_S, never hang.  usage: dead_peer.py kill|stop VICTIM"""
import os
import signal
import sys
import time

import numpy as np

import nezha

nezha.init()
RANK = nezha.rank()
how, victim = sys.argv[1], int(sys.argv[2])
x = np.ones(1 << 16, np.float32)
start = None
try:
    for step in range(100000):
        if step == 20:
            if RANK == victim:
                os.kill(os.getpid(), signal.SIGKILL if how == "kill" else signal.SIGSTOP)
            start = time.monotonic()
        nezha.allreduce(x, op=nezha.Sum, name=f"step.{step % 3}")
except nezha.NezhaError as exc:
    elapsed = time.monotonic() - start
    print(f"RAISED after {elapsed:.2f}s: {exc}", flush=True)
    sys.exit(3)
print("NO ERROR", flush=True)
