"""Allreduces for a few seconds, checking every result; prints READY once connected."""
import sys
import time

import numpy as np

import nezha

nezha.init()
RANK, SIZE = nezha.rank(), nezha.size()
print("READY", flush=True)
seconds = float(sys.argv[1])
x = np.arange(100000, dtype=np.float32) * (RANK + 1)
want = np.arange(100000, dtype=np.float32) * (SIZE * (SIZE + 1) / 2)
deadline = time.monotonic() + seconds
steps = 0
while True:
    out = nezha.allreduce(x, op=nezha.Sum, name="steady")
    assert np.array_equal(out, want), steps
    steps += 1
    # Ranks agree on when to stop (every rank must run the same number of allreduces).
    go_on = np.array([steps < 20 or time.monotonic() < deadline], np.int32)
    if not nezha.allreduce(go_on, op=nezha.Min, name="go_on")[0]:
        break
nezha.barrier()
print(f"OK rank {RANK} after {steps} steps", flush=True)
nezha.shutdown()
