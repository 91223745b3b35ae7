"""init_process_group("nezha") every way a job starts (argv[1]): env:// under a launcher
("env"), a device map ("device-map"), init_method tcp:// and file:// ("tcp", "file"; argv[2] the
address or path, rank and size from RANK / WORLD_SIZE), an explicit store ("store"), and twice in
one process ("reinit"), where destroy_process_group must leave no thread, socket or shared-memory
segment of nezha's behind. Each start is checked with an allreduce against its exact sum."""

import datetime
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

from dist_common import assert_equal, expect, report


def check_allreduce(what):
    n, r = dist.get_world_size(), dist.get_rank()
    t = torch.arange(10, dtype=torch.float64) * (r + 1)
    dist.all_reduce(t)
    assert_equal(t, torch.arange(10, dtype=torch.float64) * (n * (n + 1) // 2), what)
    # Asynchronous too: its completion runs on the backend's own threads (a synchronous call's on
    # the caller's), which "reinit" checks are there while the group lives and gone after destroy.
    dist.all_reduce(t, async_op=True).wait()
    assert_equal(t, torch.arange(10, dtype=torch.float64) * (n * (n + 1) // 2) * n, what + " (async)")
    objs = [None] * n
    dist.all_gather_object(objs, r)
    expect(objs == list(range(n)), "%s: all_gather_object %s" % (what, objs))


def footprint():
    """nezha's threads, this process's sockets, nezha's shared-memory segments."""
    threads = sorted(t.name for t in threading.enumerate() if t.name.startswith("nz-"))
    native = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open("/proc/self/task/%s/comm" % task) as comm:
                name = comm.read().strip()
        except FileNotFoundError:  # a thread (torch's or a joined one of ours) gone since listing
            continue
        if name.startswith("nz-"):
            native.append(name)
    native.sort()
    sockets = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            sockets += os.readlink("/proc/self/fd/" + fd).startswith("socket:")
        except OSError:  # the listing's own descriptor, closed by now
            pass
    segments = sorted(f for f in os.listdir("/dev/shm") if "nezha" in f and str(os.getpid()) in f)
    return threads, native, sockets, segments


mode = sys.argv[1]
rank, size = int(os.environ.get("RANK", "-1")), int(os.environ.get("WORLD_SIZE", "-1"))
if mode in ("env", "device-map", "reinit"):
    before = footprint()
    dist.init_process_group("cpu:nezha,cuda:nezha" if mode == "device-map" else "nezha")
    check_allreduce(mode)
    if mode == "reinit":
        during = footprint()
        # What the check below looks for is there while the group lives (so it can fail).
        expect(during[0] and during[1] and during[2] > before[2], "footprint while running: %s"
               % (during,))
        dist.destroy_process_group()
        # A joined thread's /proc entry can outlive pthread_join by a moment (the kernel reaps
        # it after clearing the tid), so a lingering entry is given a second to go.
        deadline = time.monotonic() + 1.0
        after = footprint()
        while after[1] and time.monotonic() < deadline:
            time.sleep(0.01)
            after = footprint()
        expect(after[0] == [] and after[1] == [], "threads left after destroy: %s" % (after,))
        expect(after[3] == [], "segments left after destroy: %s" % (after[3],))
        # torch's own store connection may stay; nezha's engine must not add any socket.
        expect(after[2] <= before[2] + 2, "sockets: %d before init, %d after destroy"
               % (before[2], after[2]))
        dist.init_process_group("nezha", timeout=datetime.timedelta(seconds=60))
        check_allreduce("second init")
        report("destroy leaves nothing behind and a second init works")
elif mode in ("tcp", "file"):
    dist.init_process_group("nezha", init_method="%s://%s" % (mode, sys.argv[2]), rank=rank,
                            world_size=size)
    check_allreduce(mode)
elif mode == "store":
    store = dist.TCPStore("127.0.0.1", int(sys.argv[2]), size, rank == 0,
                          timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("nezha", store=store, rank=rank, world_size=size)
    check_allreduce(mode)
report("init %s" % mode)
dist.destroy_process_group()
