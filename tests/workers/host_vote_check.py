"""Small allreduces on one host, repeated under one name: the first two go through rank 0 (done
within negotiation), the later ones are voted on the host board and reduced by every rank. Every
dtype and reduction, with scaling: each instance gives the same bits (rank 0's reduction and the
ranks' own are one computation), the same bits on every rank, and numpy's answer.
usage: host_vote_check.py EXPECT_VOTES (1: the later ones must be votes; 0: none may be)."""
import os
import sys

import numpy as np

import nezha

sys.path.insert(0, os.path.dirname(__file__))
from numpy_reference import DTYPES, make_input, matches, reduction  # noqa: E402

nezha.init()
r, n = nezha.rank(), nezha.size()
expect_votes = sys.argv[1] == "1"
OPS = {"Sum": nezha.Sum, "Average": nezha.Average, "Min": nezha.Min, "Max": nezha.Max,
       "Product": nezha.Product}
REPEATS = 4


def fail(what):
    print(f"FAIL rank {r}: {what}", flush=True)
    os._exit(1)


voted_before = nezha.engine_stats()["tensors_by_host_vote"]
cases = 0
results = []
for dtype in DTYPES:
    dt = np.dtype(dtype)
    for op_name, op in OPS.items():
        if dt == np.bool_ and op_name == "Average":
            continue
        elements = max(1, 8 // dt.itemsize)  # 8 bytes, at most 8 elements
        inputs = [make_input(q, elements, dt, op_name, salt=11) for q in range(n)]
        kw = {}
        if dt.kind == "f":
            kw = dict(prescale_factor=0.5, postscale_factor=3.0)
        name = f"vote.{dt.name}.{op_name}"
        got = [nezha.allreduce(inputs[r].copy(), op=op, name=name, **kw) for _ in range(REPEATS)]
        for g in got[1:]:
            if g.tobytes() != got[0].tobytes():
                fail(f"{name}: instances differ: {got[0]} / {g}")
        if kw:  # each input scaled first, the result after
            want = np.asarray(reduction([x.astype(np.float64) * 0.5 for x in inputs], dt, op_name)) * 3.0
        else:
            want = reduction(inputs, dt, op_name)
        if not matches(got[-1], want, dt, n):
            fail(f"{name}: {got[-1]} vs numpy {want}")
        results.append(got[-1].tobytes())
        cases += 1

# The same bits on every rank.
mine = np.frombuffer(b"".join(results), np.uint8)
everyone = nezha.allgather(mine[None, :], name="vote.results")
for q in range(n):
    if not np.array_equal(everyone[q], mine):
        fail(f"rank {q}'s results differ from rank {r}'s")

voted = nezha.engine_stats()["tensors_by_host_vote"] - voted_before
if expect_votes and voted != cases * (REPEATS - 2):
    fail(f"{voted} host votes, expected {cases * (REPEATS - 2)}")
if not expect_votes and voted != 0:
    fail(f"{voted} host votes with votes off")
print(f"OK rank {r}: {cases} cases, {voted} host votes", flush=True)
nezha.shutdown()
