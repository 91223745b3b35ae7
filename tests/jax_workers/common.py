"""Shared helpers for the JAX worker scripts (run under nezharun, one process per rank): each check
prints `PASS[rank] <check>`; the first failure prints FAIL and exits non-zero."""
import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import numpy as np  # noqa: E402

import nezha.jax as nj  # noqa: E402


def report(check):
    print("PASS[%d] %s" % (nj.rank(), check), flush=True)


def fail(message):
    print("FAIL[%d] %s" % (nj.rank(), message), flush=True)
    sys.exit(1)


def assert_close(actual, expected, what, rtol=1e-6, atol=1e-6):
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        fail("%s: got %s %s, expected %s %s" % (what, actual.shape, actual.dtype, expected.shape,
                                                 expected.dtype))
    if actual.dtype.kind in "biu":
        ok = np.array_equal(actual, expected)
    else:
        ok = np.allclose(actual.astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=atol)
    if not ok:
        fail("%s:\n got      %s\n expected %s" % (what, actual, expected))


def expect_error(fn, what, *needles):
    """fn() must raise an exception whose message contains every needle."""
    try:
        fn()
    except Exception as error:  # noqa: BLE001 - any exception type; the message is checked
        message = str(error)
        if all(n in message for n in needles):
            return message
        fail("%s raised, but without %s: %s" % (what, needles, message))
    fail("%s did not raise" % what)
