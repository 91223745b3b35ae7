import sys, json
sys.path.insert(0, "benchmarks")
import sim_validation as sv, train_matrix
from nezha.testbed import Testbed
sv.OUT_DIR = sv.BENCH_DIR / "out" / "sim-validation-repeat"
sv.OUT_DIR.mkdir(parents=True, exist_ok=True)
out = []
for hosts in (8, 16):
    sv.use_hosts(hosts, sv.RATE_CASES["A"])
    tb = train_matrix.bring_up(Testbed, "nzsim")
    try:
        out.append(sv.training_case(tb, hosts, "A", sv.RATE_CASES["A"]))
    finally:
        tb.down()
(sv.OUT_DIR / "repeat.json").write_text(json.dumps(out, indent=1))
