"""Initialises from whatever environment the test set up and checks an allreduce."""
import numpy as np

import nezha

nezha.init()
out = nezha.allreduce(np.full(3, nezha.rank() + 1.0), op=nezha.Sum, name="env")
n = nezha.size()
assert np.array_equal(out, np.full(3, n * (n + 1) / 2)), out
print(f"OK rank={nezha.rank()} size={n} local_rank={nezha.local_rank()} "
      f"local_size={nezha.local_size()} cross_rank={nezha.cross_rank()} "
      f"cross_size={nezha.cross_size()}", flush=True)
nezha.shutdown()
