"""Shared helpers for the torch worker scripts (run under nezharun, one process per rank)."""

import hashlib
import sys

import torch

import nezha.torch as hvd
from harness import say

# Ranks share the machine's cores; one intra-op thread each avoids OpenMP threads spinning
# against each other and against the engine's threads (a 30x slowdown on 2 cores).
torch.set_num_threads(1)


def report(check):
    say("PASS[%d] %s" % (hvd.rank(), check))


def fail(message):
    say("FAIL[%d] %s" % (hvd.rank(), message))
    sys.exit(1)


def assert_close(actual, expected, what, rtol=1e-6, atol=1e-6):
    actual, expected = actual.detach().cpu(), expected.detach().cpu()
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        fail("%s: got %s %s, expected %s %s" % (what, tuple(actual.shape), actual.dtype,
                                                 tuple(expected.shape), expected.dtype))
    if actual.dtype in (torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64):
        ok = torch.equal(actual, expected)
    else:
        ok = torch.allclose(actual.double(), expected.double(), rtol=rtol, atol=atol)
    if not ok:
        fail("%s:\n got      %s\n expected %s" % (what, actual, expected))


def digest(tensors):
    """sha256 of the exact bytes of `tensors` (bit-identity check across ranks)."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def assert_identical_on_all_ranks(tensors, what):
    digests = hvd.allgather_object(digest(tensors), name="digest." + what)
    if len(set(digests)) != 1:
        fail("%s differs across ranks: %s" % (what, digests))
