"""What nezha.tensorflow's graph path costs per step: 100 small gradients reduced inside
tf.function by one grouped op (DistributedGradientTape), by 100 separate ops (one hvd.allreduce
each, run in program order by tf.function's automatic control dependencies), the same 100
allreduces in a tf.compat.v1 session (no such order: they run together), against the engine alone
on the same numpy arrays and the step without any reduction.
Run: nezharun -np 2 python benchmarks/tf_graph_overhead.py [--tensors 100 --steps 200]
"""
import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import nezha  # noqa: E402
import nezha.tensorflow as hvd  # noqa: E402


def timed(fn, steps):
    fn()  # trace / warm up
    fn()
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    return (time.perf_counter() - start) / steps * 1e6


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tensors", type=int, default=100)
    parser.add_argument("--elements", type=int, default=256)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--host-calls", action="store_true",
                        help="run graphs as the numpy_function fallback does (for comparison; "
                             "skips the session, which can deadlock that way)")
    args = parser.parse_args()
    hvd.init()
    if args.host_calls:
        from nezha.tensorflow import _ops
        _ops._state.update(loaded=True, lib=None, why_missing="--host-calls", warned=True)
    variables = [tf.Variable(tf.random.normal([args.elements])) for _ in range(args.tensors)]

    def loss():
        return tf.add_n([tf.reduce_sum(v * v) for v in variables])

    @tf.function
    def local_step():
        with tf.GradientTape() as tape:
            value = loss()
        return tape.gradient(value, variables)

    @tf.function
    def grouped_step():
        with tf.GradientTape() as tape:
            value = loss()
        return hvd.DistributedGradientTape(tape).gradient(value, variables)

    @tf.function
    def separate_step():
        with tf.GradientTape() as tape:
            value = loss()
        return [hvd.allreduce(g) for g in tape.gradient(value, variables)]

    graph = tf.Graph()
    with graph.as_default():
        inputs = [tf.constant(np.random.rand(args.elements).astype(np.float32))
                  for _ in range(args.tensors)]
        session_fetches = [hvd.allreduce(x) for x in inputs]
    session = tf.compat.v1.Session(graph=graph)

    arrays = [np.random.rand(args.elements).astype(np.float32) for _ in range(args.tensors)]
    results = {
        "tf.function step, no reduction": timed(local_step, args.steps),
        "engine alone: nezha.grouped_allreduce (numpy)": timed(
            lambda: nezha.grouped_allreduce(arrays, name="bench.numpy"), args.steps),
        "tf.function step + DistributedGradientTape (1 grouped op)": timed(
            grouped_step, args.steps),
        "tf.function step + %d hvd.allreduce (one op each)" % args.tensors: timed(
            separate_step, args.steps),
    }
    if not args.host_calls:
        results["tf.compat.v1 session: %d hvd.allreduce (one op each)" % args.tensors] = timed(
            lambda: session.run(session_fetches), args.steps)
    if hvd.rank() == 0:
        print("%d ranks, %d tensors x %d float32, mean of %d steps (us per step):"
              % (hvd.size(), args.tensors, args.elements, args.steps))
        for what, us in results.items():
            print("  %-70s %9.0f" % (what, us))


if __name__ == "__main__":
    main()
