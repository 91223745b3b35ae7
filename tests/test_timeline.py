"""nezharun --timeline: every rank writes a Chrome trace with negotiation and per-rail events."""
import json


import pytest


@pytest.mark.parametrize("control_inline", [True, False])
def test_timeline_has_negotiation_and_rail_events(job, tmp_path, control_inline):
    # The 3-element allreduce is reduced by rank 0 within negotiation, or with
    # NEZHA_CONTROL_INLINE_BYTES=0 runs on the rail.
    path = tmp_path / "trace.json"
    env = {} if control_inline else {"NEZHA_CONTROL_INLINE_BYTES": "0"}
    result = job(2, "env_allreduce.py", nezharun_args=["--timeline", str(path)], env=env, timeout=60)
    assert result.returncode == 0, result.output
    for rank in (0, 1):
        events = json.loads((tmp_path / f"trace.{rank}.json").read_text())
        names = {(e.get("cat"), e.get("ph"), e.get("name")) for e in events}
        assert ("negotiate", "b", "env") in names and ("negotiate", "e", "env") in names, names
        # A one-host job has two rails (the automatic shmcoll too): their start-up calibration and
        # warm-up are rail events of their own, not the operation's.
        on_rail = any(e.get("ph") == "X" and e.get("cat") == "rail"
                      and not e.get("name", "").startswith("calibration") for e in events)
        by_rank0 = [e for e in events if e.get("cat") == "control" and e.get("name") == "env"]
        assert (on_rail, len(by_rank0)) == ((False, 1) if control_inline else (True, 0)), events
        if control_inline:
            assert by_rank0[0]["ph"] == "i" and by_rank0[0]["args"]["bytes"] == 24, by_rank0
        assert all(e["pid"] == rank for e in events)


def test_a_rank_placeholder_in_the_timeline_path_gives_every_rank_its_own_file(job, tmp_path):
    # One NEZHA_TIMELINE for every rank (as any launcher passes the environment): each writes its
    # own file, not all of them one garbled file.
    pattern = tmp_path / "t.{rank}.json"
    result = job(2, "env_allreduce.py", env={"NEZHA_TIMELINE": str(pattern)}, timeout=60)
    assert result.returncode == 0, result.output
    for rank in (0, 1):
        events = json.loads((tmp_path / f"t.{rank}.json").read_text())
        assert all(e["pid"] == rank for e in events)
        assert any(e.get("cat") == "negotiate" and e.get("name") == "env" for e in events), events
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.0.json", "t.1.json"]
