#!/usr/bin/env python3
"""Every allreduce's time on the testbed, not only the median: stalls, and what rank 0 learned.

nezha-bench reports a median per size, which hides an operation in forty that stalls for 100 ms.
This runs N allreduces per size on H testbed hosts (two rails at RATE each, or one rail per rate
of RATES), one rank per host, and prints per size rank 0's median, mean, 90th percentile, slowest
and the count over 10 ms (the first fifth left out as warm-up), the rails' shares of the bytes
rank 0 sent, and rank 0's per-rail estimates (alpha and rate, mid-band start-up and rate, the size
below which striping is off); then the testbed's tbf drops and TCP retransmissions and timeouts, summed over the hosts. With
NEZHA_TIMELINE=dir/trace.{rank}.json set, every rank writes its timeline (each share's time on its
rail, each negotiation).

    .venv/bin/python benchmarks/op_times.py --hosts 6 --sizes 64K,128K,256K --iters 250 \\
        [--rate 1gbit | --rates 1gbit,250mbit] [--congestion cubic|bbr|machine]        # repo root, as root
"""
from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.append(str(REPO_ROOT))

STALL_US = 10_000


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def worker(sizes, iters: int) -> None:
    import numpy as np
    import nezha as hvd

    hvd.init()
    for size in sizes:
        x = np.ones(size // 4, np.float32)
        sent_before = [s["bytes_sent"] for s in hvd.rail_stats()]
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            hvd.allreduce(x, name=f"op_times.{size}")
            times.append((time.perf_counter() - start) * 1e6)
        if hvd.rank() == 0:
            kept = sorted(times[iters // 5:])
            stats = hvd.rail_stats()
            rails = [(round(s["alpha_us"]), round(s["beta_gbps"], 3), round(s["mid_alpha_us"]),
                      round(s["mid_beta_gbps"], 3), s["min_striped_bytes"]) for s in stats]
            sent = [s["bytes_sent"] - b for s, b in zip(stats, sent_before)]
            split = "/".join(f"{100 * b / max(1, sum(sent)):.0f}" for b in sent)
            print(f"{size:>8} B  median {statistics.median(kept):8.0f} us  mean {statistics.mean(kept):8.0f}"
                  f"  p90 {kept[int(len(kept) * 0.9)]:8.0f}  max {kept[-1]:8.0f}"
                  f"  over 10 ms: {sum(t > STALL_US for t in kept):3d}  rails' bytes {split}"
                  f"  rank 0's (alpha us, Gbit/s, mid alpha us, mid Gbit/s, min striped B) per rail: {rails}",
                  flush=True)
    hvd.shutdown()


def host_counters(testbed) -> dict:
    out = {"tbf drops": 0, "TcpRetransSegs": 0, "TcpExtTCPTimeouts": 0}
    for namespace in testbed.hosts:
        qdisc = testbed.exec(namespace, ["tc", "-s", "qdisc"], capture_output=True, text=True).stdout
        out["tbf drops"] += sum(int(x) for x in re.findall(r"dropped (\d+)", qdisc))
        nstat = testbed.exec(namespace, ["nstat", "-az", "TcpRetransSegs", "TcpExtTCPTimeouts"],
                             capture_output=True, text=True).stdout
        for line in nstat.splitlines():
            fields = line.split()
            if fields and fields[0] in out:
                out[fields[0]] += int(fields[1])
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", type=int, default=6)
    parser.add_argument("--sizes", default="64K,128K,256K")
    parser.add_argument("--iters", type=int, default=250)
    parser.add_argument("--rate", default="1gbit", help="both rails' rate")
    parser.add_argument("--rates", help="each rail's rate, comma-separated (instead of --rate)")
    parser.add_argument("--congestion", default="cubic", help="hosts' TCP congestion control ('machine': its default)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    if args.worker:
        worker(sizes, args.iters)
        return 0

    from nezha.testbed import Testbed

    rates = args.rates.split(",") if args.rates else [args.rate, args.rate]
    testbed = Testbed(args.hosts, len(rates), rates=rates, prefix="nzops",
                      congestion=None if args.congestion == "machine" else args.congestion)
    with testbed:
        argv = [sys.executable, "-m", "nezha.runner", "-np", str(args.hosts), *testbed.nezharun_args(), "--",
                sys.executable, __file__, "--worker", "--sizes", args.sizes, "--iters", str(args.iters)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
        for line in done.stdout.splitlines():
            print(re.sub(r"^\[0\]<stdout>: ", "", line))
        if done.returncode != 0:
            print(done.stderr[-3000:], file=sys.stderr)
            return done.returncode
        print(f"{args.hosts} hosts x {'+'.join(rates)}, TCP {testbed.status()['hosts'][0]['congestion']}: "
              f"{host_counters(testbed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
