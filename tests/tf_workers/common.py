"""Shared helpers for the TensorFlow/Keras worker scripts (run under nezharun, one per rank)."""
import hashlib
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_NUM_INTEROP_THREADS", "2")
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")

import numpy as np  # noqa: E402

import nezha  # noqa: E402


def report(check):
    print("PASS[%d] %s" % (nezha.rank(), check), flush=True)


def fail(message):
    print("FAIL[%d] %s" % (nezha.rank(), message), flush=True)
    sys.exit(1)


def assert_close(actual, expected, what, rtol=1e-6, atol=1e-6):
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.shape != expected.shape:
        fail("%s: shape %s, expected %s" % (what, actual.shape, expected.shape))
    if actual.dtype.kind in "biu":
        ok = np.array_equal(actual, expected)
    else:
        ok = np.allclose(actual.astype(np.float64), expected.astype(np.float64), rtol=rtol,
                         atol=atol)
    if not ok:
        fail("%s:\n got      %s\n expected %s" % (what, actual, expected))


def assert_identical_on_all_ranks(arrays, what):
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    digests = nezha.allgather_object(h.hexdigest(), name="digest." + what)
    if len(set(digests)) != 1:
        fail("%s differs across ranks: %s" % (what, digests))
