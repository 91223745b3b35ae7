"""Helpers for the workers of the torch.distributed backend "nezha" (run under nezharun or torchrun,
one process per rank): PASS/FAIL lines, every rank's inputs computed on every rank (so each
result is checked against a reference computed here with torch), and bit identity across ranks."""

import hashlib
import sys

import torch
import torch.distributed as dist

from harness import say

import nezha.torch  # noqa: F401  (registers the backend "nezha")

# Ranks share the machine's cores; one intra-op thread each (see common.py).
torch.set_num_threads(1)


def rank():
    return dist.get_rank() if dist.is_initialized() else -1


def report(check):
    say("PASS[%d] %s" % (rank(), check))


def fail(message):
    say("FAIL[%d] %s" % (rank(), message))
    sys.exit(1)


def expect(condition, message):
    if not condition:
        fail(message)


def value(r, tag, shape, dtype):
    """Rank r's input for check `tag`: deterministic, so every rank can compute every rank's."""
    g = torch.Generator().manual_seed(7919 * r + 104729 * tag)
    if dtype.is_complex:
        real = torch.randint(-8, 9, shape, generator=g).to(torch.float32)
        imag = torch.randint(-8, 9, shape, generator=g).to(torch.float32)
        return torch.complex(real, imag).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        return (torch.randint(-64, 65, shape, generator=g).to(torch.float64) / 8).to(dtype)
    low = 0 if dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64) else -9
    return torch.randint(low, 10, shape, generator=g).to(dtype)


def assert_equal(actual, expected, what, exact=True, rtol=1e-6, atol=1e-6):
    actual, expected = actual.detach().cpu(), expected.detach().cpu()
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        fail("%s: got %s %s, expected %s %s" % (what, tuple(actual.shape), actual.dtype,
                                                 tuple(expected.shape), expected.dtype))
    if exact or not (actual.is_floating_point() or actual.is_complex()):
        ok = torch.equal(actual.view(torch.uint8) if actual.dtype == torch.bool else actual,
                         expected.view(torch.uint8) if expected.dtype == torch.bool else expected)
    else:
        ok = torch.allclose(actual.to(torch.complex128 if actual.is_complex() else torch.float64),
                            expected.to(torch.complex128 if expected.is_complex()
                                        else torch.float64), rtol=rtol, atol=atol)
    if not ok:
        fail("%s:\n got      %s\n expected %s" % (what, actual.flatten()[:16],
                                                   expected.flatten()[:16]))


def digest(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def assert_identical_on_all_ranks(tensors, what, group=None):
    digests = [None] * dist.get_world_size(group)
    dist.all_gather_object(digests, digest(tensors), group=group)
    if len(set(digests)) != 1:
        fail("%s differs across ranks: %s" % (what, digests))
