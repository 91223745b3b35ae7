"""Process sets (Horovod's semantics) across 4 real processes: collectives among a set's ranks
against numpy, overlapping sets in flight with global collectives, errors on every rank concerned,
removal and init(process_sets=...) (workers/process_sets_check.py; torch: torch_workers/
w_process_sets.py)."""
CHECKS = ["registered", "allreduce", "every collective in a set", "overlapping sets in flight", "errors",
          "removal", "init(process_sets=...)"]


def test_process_sets_on_numpy(job):
    result = job(4, "process_sets_check.py", timeout=240)
    assert result.returncode == 0, result.output[-4000:]
    for r in range(4):
        for check in CHECKS:
            assert f"OK rank {r}: {check}" in result.lines(r), (r, check, result.output[-4000:])
