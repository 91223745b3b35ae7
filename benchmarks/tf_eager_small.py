"""A small eager allreduce from TensorFlow: `nezha.tensorflow.allreduce` with nothing recording,
under a GradientTape, and `nezha.allreduce` of the same bytes from numpy, in one job; rank 0 prints
each one's median over the calls.

    nezharun -np 2 python benchmarks/tf_eager_small.py [--elements 2 --calls 2000] [--json F]
"""
import argparse
import json
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import nezha  # noqa: E402
import nezha.tensorflow as hvd  # noqa: E402


def median_us(fn, calls, warmup=100):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--elements", type=int, default=2, help="float32 elements per call")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--json")
    args = parser.parse_args()
    hvd.init()
    x = tf.ones([args.elements])
    array = np.ones(args.elements, np.float32)

    def under_tape():
        with tf.GradientTape() as tape:
            tape.watch(x)
            hvd.allreduce(x, op=hvd.Sum)

    impls = {"tf eager": lambda: hvd.allreduce(x, op=hvd.Sum),
             "tf eager under a GradientTape": under_tape,
             "numpy nezha.allreduce": lambda: nezha.allreduce(array, op=nezha.Sum)}
    records = [{"impl": name, "bytes": 4 * args.elements, "ranks": hvd.size(),
                "time_us": median_us(fn, args.calls)} for name, fn in impls.items()]
    if hvd.rank() == 0:
        for r in records:
            print("%-32s %8.1f us" % (r["impl"], r["time_us"]), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
