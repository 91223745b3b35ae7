"""Synthetic training throughput with nezha.tensorflow: a custom tf.function training loop with
DistributedGradientTape (the flags of Horovod's script of this name).

    nezharun -np 4 python examples/tensorflow2_synthetic_benchmark.py --model mlp46m --batch-size 16
"""
import argparse
import json
import os
import timeit

import numpy as np

parser = argparse.ArgumentParser(description="TensorFlow Synthetic Benchmark",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--fp16-allreduce", action="store_true", default=False,
                    help="use fp16 compression during allreduce")
parser.add_argument("--model", type=str, default="ResNet50",
                    help="model to benchmark: mlp, mlp46m, convnet or a keras.applications name")
parser.add_argument("--batch-size", type=int, default=32, help="input batch size")
parser.add_argument("--num-warmup-batches", type=int, default=10,
                    help="number of warm-up batches that don't count towards benchmark")
parser.add_argument("--num-batches-per-iter", type=int, default=10,
                    help="number of batches per benchmark iteration")
parser.add_argument("--num-iters", type=int, default=10, help="number of benchmark iterations")
parser.add_argument("--eager", action="store_true", default=False,
                    help="enables eager execution")
parser.add_argument("--no-cuda", action="store_true", default=False,
                    help="disables CUDA training (this build is CPU only)")
parser.add_argument("--image-size", type=int, default=224, help="input height and width")
parser.add_argument("--num-threads", type=int, default=0,
                    help="TensorFlow intra-op threads per rank (0: TensorFlow's default)")
parser.add_argument("--json", type=str, default=None, help="rank 0 writes losses and figures here")
args = parser.parse_args()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import nezha.tensorflow as hvd  # noqa: E402
from keras_models import build, input_size  # noqa: E402

hvd.init()
if args.num_threads:
    tf.config.threading.set_intra_op_parallelism_threads(args.num_threads)
tf.keras.utils.set_random_seed(42)
model = build(args.model, input_size(args.model, args.image_size))
optimizer = tf.keras.optimizers.SGD(0.01)
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
size = input_size(args.model, args.image_size)
rng = np.random.default_rng(hvd.rank())
data = tf.constant(rng.random((args.batch_size, size, size, 3), dtype=np.float32))
target = tf.constant(rng.integers(0, 1000, args.batch_size))
loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def benchmark_step(first_batch):
    with tf.GradientTape() as tape:
        loss = loss_fn(target, model(data, training=True))
    tape = hvd.DistributedGradientTape(tape, compression=compression)
    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    # Every rank starts from rank 0's weights (after the first step, so optimizer state exists).
    if first_batch:
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(optimizer.variables, root_rank=0)
    return loss


step = benchmark_step if args.eager else tf.function(benchmark_step)
losses = [float(step(True))]


def log(text):
    if hvd.rank() == 0:
        print(text, flush=True)


log("Model: %s" % args.model)
log("Batch size: %d" % args.batch_size)
log("Number of ranks: %d" % hvd.size())
log("Running warmup...")
for _ in range(args.num_warmup_batches):
    losses.append(float(step(False)))
log("Running benchmark...")
img_secs = []
for x in range(args.num_iters):
    time_s = timeit.timeit(lambda: losses.append(float(step(False))),
                           number=args.num_batches_per_iter)
    img_sec = args.batch_size * args.num_batches_per_iter / time_s
    log("Iter #%d: %.1f img/sec per rank" % (x, img_sec))
    img_secs.append(img_sec)
mean, conf = np.mean(img_secs), 1.96 * np.std(img_secs)
log("Img/sec per rank: %.1f +-%.1f" % (mean, conf))
log("Total img/sec on %d rank(s): %.1f +-%.1f" % (hvd.size(), hvd.size() * mean,
                                                  hvd.size() * conf))
if args.json and hvd.rank() == 0:
    with open(args.json, "w") as f:
        json.dump({"losses": losses, "img_sec_per_rank": float(mean), "ranks": hvd.size()}, f)
