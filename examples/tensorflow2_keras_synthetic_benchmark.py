"""Synthetic training throughput with nezha.keras: model.fit with DistributedOptimizer (the flags
of Horovod's script of this name). Runs on any Keras 3 backend (KERAS_BACKEND).

    nezharun -np 4 python examples/tensorflow2_keras_synthetic_benchmark.py --model mlp46m
"""
import argparse
import json
import os
import time

import numpy as np

parser = argparse.ArgumentParser(description="TensorFlow Keras Synthetic Benchmark",
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
parser.add_argument("--no-cuda", action="store_true", default=False,
                    help="disables CUDA training (this build is CPU only)")
parser.add_argument("--image-size", type=int, default=224, help="input height and width")
parser.add_argument("--json", type=str, default=None, help="rank 0 writes its figures here")
args = parser.parse_args()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402

import nezha.keras as hvd  # noqa: E402
from keras_models import build, input_size  # noqa: E402

hvd.init()
keras.utils.set_random_seed(42)
size = input_size(args.model, args.image_size)
model = build(args.model, size)
optimizer = hvd.DistributedOptimizer(
    keras.optimizers.SGD(0.01),
    compression=hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none)
model.compile(optimizer=optimizer,
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
rng = np.random.default_rng(hvd.rank())
data = rng.random((args.batch_size, size, size, 3), dtype=np.float32)
target = rng.integers(0, 1000, (args.batch_size,))


class Timing(keras.callbacks.Callback):
    """Times each group of num_batches_per_iter batches after the warm-up batches."""

    def __init__(self):
        super().__init__()
        self.img_secs, self.start = [], None

    def on_train_batch_begin(self, batch, logs=None):
        if batch >= args.num_warmup_batches and \
                (batch - args.num_warmup_batches) % args.num_batches_per_iter == 0:
            self.start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        done = batch + 1 - args.num_warmup_batches
        if done > 0 and done % args.num_batches_per_iter == 0:
            elapsed = time.perf_counter() - self.start
            img_sec = args.batch_size * args.num_batches_per_iter / elapsed
            self.img_secs.append(img_sec)
            if hvd.rank() == 0:
                print("Iter #%d: %.1f img/sec per rank" % (len(self.img_secs) - 1, img_sec),
                      flush=True)


timing = Timing()
steps = args.num_warmup_batches + args.num_batches_per_iter * args.num_iters
x = np.broadcast_to(data, (steps,) + data.shape).reshape((-1,) + data.shape[1:])
y = np.tile(target, steps)
if hvd.rank() == 0:
    print("Model: %s, batch size: %d, ranks: %d, backend: %s"
          % (args.model, args.batch_size, hvd.size(), keras.backend.backend()), flush=True)
history = model.fit(x, y, batch_size=args.batch_size, epochs=1, shuffle=False,
                    verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                          timing])
mean, conf = np.mean(timing.img_secs), 1.96 * np.std(timing.img_secs)
if hvd.rank() == 0:
    print("Img/sec per rank: %.1f +-%.1f" % (mean, conf))
    print("Total img/sec on %d rank(s): %.1f +-%.1f" % (hvd.size(), hvd.size() * mean,
                                                       hvd.size() * conf))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"img_sec_per_rank": float(mean), "ranks": hvd.size(),
                       "loss": float(history.history["loss"][-1])}, f)
