"""nezharun --timeline: every rank writes a Chrome trace with negotiation and per-rail events."""
import json


def test_timeline_has_negotiation_and_rail_events(job, tmp_path):
    path = tmp_path / "trace.json"
    result = job(2, "env_allreduce.py", nezharun_args=["--timeline", str(path)], timeout=60)
    assert result.returncode == 0, result.output
    for rank in (0, 1):
        events = json.loads((tmp_path / f"trace.{rank}.json").read_text())
        names = {(e.get("cat"), e.get("ph"), e.get("name")) for e in events}
        assert ("negotiate", "b", "env") in names and ("negotiate", "e", "env") in names, names
        assert any(e.get("ph") == "X" and e.get("cat") == "rail" for e in events), events
        assert all(e["pid"] == rank for e in events)
