"""The baseline of benchmarks/keras_vs_mwms.py: the same synthetic Keras training as
examples/tensorflow2_keras_synthetic_benchmark.py under tf.distribute.MultiWorkerMirroredStrategy
(RING collectives over gRPC). One process per worker, TF_CONFIG set by the caller.

`--loop fit` uses model.fit under the strategy; `--loop custom` a tf.function training loop with
strategy.run (for when model.fit fails under the strategy with Keras 3).
"""
import argparse
import json
import os
import sys
import time

import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="mlp46m")
parser.add_argument("--batch-size", type=int, default=16, help="per worker")
parser.add_argument("--image-size", type=int, default=224)
parser.add_argument("--num-warmup-batches", type=int, default=2)
parser.add_argument("--num-batches-per-iter", type=int, default=3)
parser.add_argument("--num-iters", type=int, default=3)
parser.add_argument("--loop", choices=("fit", "custom"), default="custom")
parser.add_argument("--json", default=None)
args = parser.parse_args()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

import tensorflow as tf  # noqa: E402

strategy = tf.distribute.MultiWorkerMirroredStrategy(
    communication_options=tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING))
import keras  # noqa: E402
from keras_models import build, input_size  # noqa: E402

task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
workers = strategy.num_replicas_in_sync
size = input_size(args.model, args.image_size)
rng = np.random.default_rng(task)
data = rng.random((args.batch_size, size, size, 3), dtype=np.float32)
target = rng.integers(0, 1000, (args.batch_size,))
steps = args.num_warmup_batches + args.num_batches_per_iter * args.num_iters
keras.utils.set_random_seed(42)
with strategy.scope():
    model = build(args.model, size)
    optimizer = keras.optimizers.SGD(0.01)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="sum_over_batch_size")
step_times = []

if args.loop == "fit":
    with strategy.scope():
        model.compile(optimizer=optimizer, loss=loss_fn)

    class Timing(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            step_times.append(time.perf_counter() - self.start)

    x = np.broadcast_to(data, (steps,) + data.shape).reshape((-1,) + data.shape[1:])
    y = np.tile(target, steps)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch_size * workers)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    model.fit(dataset.with_options(options), epochs=1, verbose=0, callbacks=[Timing()])
else:
    def local_step(images, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True)) / workers
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    @tf.function
    def train_step(images, labels):
        return strategy.run(local_step, args=(images, labels))

    images, labels = tf.constant(data), tf.constant(target)
    for _ in range(steps):
        start = time.perf_counter()
        train_step(images, labels)
        step_times.append(time.perf_counter() - start)

timed = step_times[args.num_warmup_batches:]
step_s = float(np.mean(timed))
# Equal on every worker only if the gradients were really all-reduced.
checksum = float(sum(np.sum(np.asarray(v, np.float64)) for v in model.trainable_variables))
if args.json and task > 0:
    with open("%s.%d" % (args.json, task), "w") as f:
        json.dump({"checksum": checksum}, f)
if task == 0:
    print("MWMS %s (%s): %.3f s/step, %.1f samples/s total"
          % (args.model, args.loop, step_s, workers * args.batch_size / step_s), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"img_sec_per_rank": args.batch_size / step_s, "ranks": workers,
                       "step_s": step_s, "loop": args.loop, "checksum": checksum}, f)
