"""A Horovod-style Keras script on data generated here (10 classes of noisy 28x28 prototype
images, so nothing is downloaded): it learns, and reports test loss and accuracy per epoch. Runs on
every Keras 3 backend:

    KERAS_BACKEND=tensorflow nezharun -np 2 python examples/keras_mnist_like.py
    KERAS_BACKEND=torch      nezharun -np 2 python examples/keras_mnist_like.py
    KERAS_BACKEND=jax        nezharun -np 2 python examples/keras_mnist_like.py   (needs nezha.jax)

Written for horovod.tensorflow.keras; only the import changed.
"""
import argparse
import os

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402

import nezha.keras as hvd  # was: import horovod.tensorflow.keras as hvd  # noqa: E402

parser = argparse.ArgumentParser(description="Keras MNIST-like example")
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--batch-size", type=int, default=32, help="per rank")
parser.add_argument("--lr", type=float, default=0.01, help="per rank; scaled by the ranks")
parser.add_argument("--train-samples", type=int, default=4096)
parser.add_argument("--test-samples", type=int, default=1024)
args = parser.parse_args()

hvd.init()


def make_data(samples, seed):
    """Each class is a fixed random 28x28 prototype; samples are prototypes plus heavy noise."""
    prototypes = np.random.default_rng(1234).normal(size=(10, 28, 28)).astype("float32")
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, samples)
    images = prototypes[labels] + 2.5 * rng.normal(size=(samples, 28, 28)).astype("float32")
    return images[..., None], labels


# Every rank draws its own shard of the training data; the test set is the same everywhere.
x_train, y_train = make_data(args.train_samples // hvd.size(), seed=hvd.rank())
x_test, y_test = make_data(args.test_samples, seed=10_000)

keras.utils.set_random_seed(hvd.rank())  # different on purpose: the callback broadcasts rank 0's
model = keras.Sequential([
    keras.Input((28, 28, 1)),
    keras.layers.Conv2D(8, 3, activation="relu"),
    keras.layers.MaxPooling2D(),
    keras.layers.Flatten(),
    keras.layers.Dense(64, activation="relu"),
    keras.layers.Dense(10),
])
scaled_lr = args.lr * hvd.size()
optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(scaled_lr, momentum=0.9))
model.compile(optimizer=optimizer,
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])

loss, accuracy = model.evaluate(x_test, y_test, verbose=0)
if hvd.rank() == 0:
    print("backend %s, %d ranks" % (keras.backend.backend(), hvd.size()))
    print("before training: test loss %.4f, accuracy %.1f%%" % (loss, 100 * accuracy), flush=True)


class Report(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        test_loss, test_accuracy = self.model.evaluate(x_test, y_test, verbose=0)
        if hvd.rank() == 0:
            print("epoch %d: train loss %.4f, test loss %.4f, test accuracy %.1f%%"
                  % (epoch + 1, logs["loss"], test_loss, 100 * test_accuracy), flush=True)


callbacks = [
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    hvd.callbacks.MetricAverageCallback(),
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=1, verbose=1),
    Report(),
]
model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs, verbose=0,
          callbacks=callbacks)
