"""False failovers with many ranks on slow rails (issue 18 point 4): 16 testbed hosts, two 250 Mbit/s
rails, one short nezha-bench job per entry of --jobs; prints per job its exit code, the number of
"continuing on" warnings (a rail failed over: on a healthy testbed each one is a false alarm), the
retransmitted TCP segments of all hosts (nstat) and rank 0's figures. Needs root.

    .venv/bin/python benchmarks/sixteen_rank_alarms.py [--jobs allgather:1M,alltoall:16M] [--repeat 3]
        [--log-dir DIR]
"""
import argparse
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def retransmitted(tb):
    total = 0
    for host in tb.hosts:
        out = subprocess.run(["ip", "netns", "exec", host, "nstat", "-az", "TcpRetransSegs"],
                             capture_output=True, text=True).stdout
        m = re.search(r"TcpRetransSegs\s+(\d+)", out)
        total += int(m.group(1)) if m else 0
    return total


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--jobs", default="allgather:1M,allreduce:1M,16M,broadcast:1M,4M,reducescatter:1M,16M,alltoall:1M,16M",
                   help="op:sizes entries; a size list's commas stay with its op")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--log-dir", default=None, help="keep each job's output here")
    args = p.parse_args()
    jobs = re.findall(r"([a-z]+):([0-9KMG,]+?)(?=,[a-z]|$)", args.jobs)
    from nezha.testbed import Testbed
    with Testbed(hosts=16, rails=2, rates=["250mbit", "250mbit"], prefix="nz16r") as tb:
        for rep in range(args.repeat):
            for op, sizes in jobs:
                argv = [sys.executable, "-m", "nezha.runner", "-np", "16", *tb.nezharun_args(), "--",
                        sys.executable, "-m", "nezha.bench", "--op", op, "--sizes", sizes, "--iters", "3",
                        "--warmup", "1"]
                before, started = retransmitted(tb), time.time()
                proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
                lines = proc.stdout.splitlines()
                if args.log_dir:
                    os.makedirs(args.log_dir, exist_ok=True)
                    with open(os.path.join(args.log_dir, f"{op}-{sizes.replace(',', '_')}-{rep}.log"), "w") as f:
                        f.write(proc.stdout)
                alarms = [l for l in lines if "continuing on" in l]
                print(f"{op} {sizes}: exit {proc.returncode}, {time.time() - started:.0f} s, "
                      f"{len(alarms)} failover warnings, {retransmitted(tb) - before} TCP retransmissions", flush=True)
                for l in alarms[:1] + [l for l in lines if l.startswith("[0]") and "nezha-bench: nezha" in l]:
                    print("   ", l[:240])
                if proc.returncode:
                    print("   ", "\n    ".join(lines[-4:]))


if __name__ == "__main__":
    main()
