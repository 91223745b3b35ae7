"""Checks that this job's data went over the shm rail: a few allreduces, then rail_stats() must
list a rail of kind 'shm' that carried the bytes. Prints 'OK rank R: ...'."""
import numpy as np

import nezha

nezha.init()
RANK, SIZE = nezha.rank(), nezha.size()
for step in range(4):
    x = np.full(1 << 18, RANK + 1, np.float32)  # 1 MiB: on the rails, not inside negotiation
    got = nezha.allreduce(x, op=nezha.Sum, name=f"traffic.{step}")
    assert np.all(got == SIZE * (SIZE + 1) / 2), got[:4]
stats = nezha.rail_stats()
kinds = [s["kind"] for s in stats]
assert "shm" in kinds, stats
shm = stats[kinds.index("shm")]
assert shm["bytes_sent"] >= 4 * (1 << 20) * (SIZE - 1) // SIZE, stats
others = sum(s["bytes_sent"] for s in stats if s is not shm)
assert others == 0, f"data also went over non-shm rails: {stats}"
print(f"OK rank {RANK}: {shm['bytes_sent']} bytes over {shm['name']}", flush=True)
