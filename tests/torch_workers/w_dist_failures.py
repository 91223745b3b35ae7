"""Failures on the backend "nezha" raise on every rank, in time, naming what failed; never a hang.

usage: w_dist_failures.py mismatch              (2 ranks under nezharun)
       w_dist_failures.py dead PORT VICTIM      (ranks started without a supervisor: the victim
                                                 SIGKILLs itself mid-run; the others must raise)
"""

import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

from dist_common import assert_equal, expect, fail, report

GROUP_TIMEOUT_S = 5


def expect_raise(what, fn, *needles):
    started = time.monotonic()
    try:
        fn()
    except dist.DistBackendError as exc:
        message = str(exc)
        for needle in needles:
            expect(needle in message, "%s: %r not in the error: %s" % (what, needle, message))
        return time.monotonic() - started
    fail("%s did not raise" % what)


def mismatches():
    rank = dist.get_rank()
    t = torch.ones(4 + rank)
    expect_raise("shape mismatch", lambda: dist.all_reduce(t), "mismatched shape",
                 "tdist.world.allreduce")
    u = torch.ones(3, dtype=torch.float32 if rank == 0 else torch.float64)
    expect_raise("dtype mismatch", lambda: dist.all_reduce(u, async_op=True).wait(), "dtype")
    outs = [torch.empty(2) for _ in range(2)]
    expect_raise("allgather mismatch in a future",
                 lambda: dist.all_gather(outs, torch.ones(2 + rank), async_op=True)
                 .get_future().wait(), "allgather")
    v = torch.ones(5)
    dist.all_reduce(v)
    assert_equal(v, torch.full((5,), 2.0), "the group works after the mismatches")
    report("mismatches raise on every rank and the group goes on")
    # A collective only rank 0 calls: its work fails at the group's timeout, naming itself,
    # while rank 1 lives on (it waits in torch's store until rank 0 has seen the timeout). Once
    # synchronous (the waiter keeps the timeout) and once asynchronous (the completer does).
    store = dist.distributed_c10d._get_default_store()
    if rank == 0:
        for how, call in (("synchronous", lambda: dist.all_reduce(torch.ones(2))),
                          ("asynchronous", lambda: dist.all_reduce(torch.ones(2), async_op=True).wait())):
            took = expect_raise("a %s collective the other rank never calls" % how, call, "timed out",
                                "tdist.world.allreduce")
            expect(GROUP_TIMEOUT_S - 1 <= took <= GROUP_TIMEOUT_S + 10, "the %s timeout took %.1f s for "
                   "a group timeout of %d s" % (how, took, GROUP_TIMEOUT_S))
        store.set("rank 0 timed out", b"")
    else:
        store.wait(["rank 0 timed out"], datetime.timedelta(seconds=60))
    report("the group's timeout is honoured")


def dead_peer(victim):
    rank = dist.get_rank()
    x = torch.ones(1 << 14)
    started = None
    for step in range(100000):
        if step == 20:
            if rank == victim:
                os.kill(os.getpid(), signal.SIGKILL)
            started = time.monotonic()
        try:
            dist.all_reduce(x)
        except dist.DistBackendError as exc:
            print("RAISED after %.2fs: %s" % (time.monotonic() - started, exc), flush=True)
            sys.exit(3)
    print("NO ERROR", flush=True)


mode = sys.argv[1]
if mode == "mismatch":
    dist.init_process_group("nezha", timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
    mismatches()
    os._exit(0)  # rank 0's stranded collective: the job cannot end in step (nezharun ends it)
else:
    rank, size = int(os.environ["NEZHA_RANK"]), int(os.environ["NEZHA_SIZE"])
    dist.init_process_group("nezha", init_method="tcp://127.0.0.1:%s" % sys.argv[2], rank=rank,
                            world_size=size)
    dead_peer(int(sys.argv[3]))
