"""nezha.keras's DistributedOptimizer of a process set on the Keras backend named by argv[1], on 3
ranks: every rank builds the optimizer of the pair {0, 2}; ranks 0 and 2 average their gradients over
the pair (fit equals one process fitting both batches), rank 1, outside it, steps on its own
(Horovod's semantics), against a single-process reference."""
import os
import sys

os.environ["KERAS_BACKEND"] = sys.argv[1]

from common import assert_close, fail, report  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402

import nezha.keras as hvd  # noqa: E402

if sys.argv[1] == "torch":
    import torch
    torch.set_num_threads(1)

hvd.init()
me = hvd.rank()
if hvd.size() != 3:
    fail("run on 3 ranks")
pair = hvd.add_process_set([0, 2])
data = {r: ((np.arange(8).reshape(4, 2) + 3 * r + 1) % 7).astype(np.float32) for r in range(3)}
ys = {r: data[r].sum(axis=1, keepdims=True) for r in range(3)}


def model():
    keras.utils.set_random_seed(7)
    return keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])


reducing = pair.ranks if me in pair.ranks else [me]
dist = model()
dist.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), process_set=pair), loss="mse")
dist.fit(data[me], ys[me], batch_size=4, epochs=2, shuffle=False, verbose=0)
ref = model()
ref.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
ref.fit(np.concatenate([data[r] for r in reducing]), np.concatenate([ys[r] for r in reducing]),
        batch_size=4 * len(reducing), epochs=2, shuffle=False, verbose=0)
for a, b in zip(dist.get_weights(), ref.get_weights()):
    assert_close(np.asarray(a), np.asarray(b), "DistributedOptimizer of the pair on " + sys.argv[1],
                 rtol=1e-5, atol=1e-6)
report("keras optimizer of a set")
hvd.shutdown()
