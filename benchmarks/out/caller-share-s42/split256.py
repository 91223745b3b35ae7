# 256 KB allreduces on the testbed: time per call and what the planner knows of each rail.
import os, time, json, numpy as np, nezha
nezha.init()
size = int(os.environ.get("BYTES", 262144)) // 4
x = np.ones(size, np.float32)
for _ in range(20): nezha.allreduce(x, name="w")
times = []
for _ in range(int(os.environ.get("N", 200))):
    t = time.perf_counter(); nezha.allreduce(x, name="w"); times.append(time.perf_counter() - t)
if nezha.rank() == 0:
    print(json.dumps({"median_us": sorted(times)[len(times)//2]*1e6,
                      "rails": [{k: r[k] for k in ("name","alpha_us","beta_gbps","share","bytes_sent")} for r in nezha.rail_stats()]}))
nezha.shutdown()
