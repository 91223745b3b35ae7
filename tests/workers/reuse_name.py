"""Rank 0 reuses a name while its first use is still waiting for rank 1."""
import time

import numpy as np

import nezha

nezha.init()
if nezha.rank() == 0:
    h = nezha.allreduce_async(np.ones(3), name="busy")
    try:
        nezha.allreduce_async(np.ones(3), name="busy")
    except ValueError as exc:
        assert "busy" in str(exc) and "in flight" in str(exc), exc
        print("OK", flush=True)
    else:
        raise AssertionError("reusing an in-flight name did not raise")
    h.wait()
else:
    time.sleep(0.5)
    nezha.allreduce(np.ones(3), name="busy")
nezha.shutdown()
