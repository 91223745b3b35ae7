"""A rank dies (SIGKILL) or freezes (SIGSTOP) mid-run; every other rank must raise NezhaError
naming it within NEZHA_TIMEOUT_S, never hang.  usage: dead_peer.py kill|stop VICTIM [OP [ELEMENTS]]
OP: allreduce (the default), broadcast, allgather, reducescatter or alltoall, what the ranks run in a
loop; ELEMENTS: float32 elements per rank (65536: on the rails; 2: done by rank 0 within
negotiation, or on one host by every rank from the host board). A survivor prints how many
tensors it took from the host board."""
import os
import signal
import sys
import time

import numpy as np

import nezha

nezha.init()
RANK = nezha.rank()
how, victim = sys.argv[1], int(sys.argv[2])
OP = sys.argv[3] if len(sys.argv) > 3 else "allreduce"
RUN = {
    "allreduce": lambda x, name: nezha.allreduce(x, op=nezha.Sum, name=name),
    "broadcast": lambda x, name: nezha.broadcast(x, root_rank=0, name=name),
    "allgather": lambda x, name: nezha.allgather(x, name=name),
    "reducescatter": lambda x, name: nezha.reducescatter(x, op=nezha.Sum, name=name),
    "alltoall": lambda x, name: nezha.alltoall(x[:x.size // nezha.size() * nezha.size()], name=name),
}[OP]
x = np.ones(int(sys.argv[4]) if len(sys.argv) > 4 else 1 << 16, np.float32)
start = None
try:
    for step in range(100000):
        if step == 20:
            if RANK == victim:
                os.kill(os.getpid(), signal.SIGKILL if how == "kill" else signal.SIGSTOP)
            start = time.monotonic()
        RUN(x, f"step.{step % 3}")
except nezha.NezhaError as exc:
    elapsed = time.monotonic() - start
    print(f"RAISED after {elapsed:.2f}s: {exc}", flush=True)
    print(f"HOST VOTES {nezha.engine_stats()['tensors_by_host_vote']}", flush=True)
    sys.exit(3)
print("NO ERROR", flush=True)
