"""Hierarchical allreduce on a job whose hosts hold several ranks (the testbed, nezharun -H
h0:2,h1:2 or h0:3,h1:1, shm added automatically): every dtype x op against numpy at sizes that
reach the rails, bit-identical on every rank, and the data through each host's shared memory where
the host has several ranks. Prints 'OK rank R: ...'."""
import hashlib

import numpy as np

import nezha
from numpy_reference import DTYPES, make_input, matches, reduction

nezha.init()
RANK, SIZE, LOCAL = nezha.rank(), nezha.size(), nezha.local_size()
OPS = {"Sum": nezha.Sum, "Average": nezha.Average, "Min": nezha.Min, "Max": nezha.Max,
       "Product": nezha.Product}

for dtype in DTYPES:
    dt = np.dtype(dtype)
    for op_name, op in OPS.items():
        if dt == np.bool_ and op_name == "Average":
            continue
        # Odd sizes: uneven slices; the large one only for the 4/8-byte Sum and Average.
        sizes = [5003] + ([300001] if dt.itemsize >= 4 and op_name in ("Sum", "Average") else [])
        for n in sizes:
            inputs = [make_input(r, n, dt, op_name) for r in range(SIZE)]
            name = f"h.{dt.name}.{op_name}.{n}"
            got = nezha.allreduce(inputs[RANK], op=op, name=name)
            want = reduction(inputs, dt, op_name)
            assert matches(got, want, dt, SIZE), f"{name}: got {got[:6]}, want {want[:6]}"
            d = np.frombuffer(hashlib.sha256(got.tobytes()).digest()[:16], np.uint8)
            everyone = nezha.allgather(d[None, :], name=f"digest.{name}")
            assert all(np.array_equal(everyone[0], everyone[r]) for r in range(SIZE)), f"{name}: ranks differ"

stats = nezha.rail_stats()
kinds = [s["kind"] for s in stats if s["kind"] != "shmcoll"]  # a collective rail has no lane
assert all(k.endswith(("+shm", "+shmcoll")) for k in kinds), f"no host lane on the rails: {stats}"
lane = sum(s["lane_bytes_sent"] for s in stats)
if LOCAL > 1:
    assert lane > 0, f"nothing went through shared memory on a host of {LOCAL} ranks: {stats}"
else:
    assert lane == 0, f"a rank alone on its host sent {lane} bytes through shared memory"
print(f"OK rank {RANK}: {len(DTYPES)} dtypes x {len(OPS)} ops, {lane} bytes over the host lane, "
      f"rails {kinds}", flush=True)
