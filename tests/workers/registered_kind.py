"""A rail kind the core's table does not ship, registered at run time (its maker borrowed from
tcp), carries a striped allreduce over two loopback rails: exact on both ranks, bytes on both."""
import numpy as np

from nezha import _core

_core.testing.register_rail_kind("lane", _core.RailTarget.local_address, like="tcp")

import nezha  # noqa: E402

nezha.init(rails="lane:127.0.0.1/32,lane:127.0.0.2/32")
n = 4 << 20  # 16 MB of float32: large enough to be split over both rails
for step in range(3):
    x = np.full(n, nezha.rank() + 1 + step, dtype=np.float32)
    out = nezha.allreduce(x, op=nezha.Sum, name=f"lane.{step}")
    assert np.array_equal(out, np.full(n, 3 + 2 * step, dtype=np.float32)), out[:4]
stats = nezha.rail_stats()
assert [s["name"] for s in stats] == ["127.0.0.1/32", "127.0.0.2/32"], stats
assert all(s["bytes_sent"] > 0 for s in stats), stats
nezha.shutdown()
print("registered kind ok")
