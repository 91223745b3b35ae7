"""This process's threads, from /proc (Linux): CPU time and context switches, by thread name.

The engine's threads are named (nz-engine, nz-rail, nz-watchdog, ...: common/thread_name.h), so
these tell the engine's share of a small operation's cost from the framework's
(benchmarks/small_op_threads.py) and show whether a thread slept through a run (tests).
"""
import os
from typing import NamedTuple


class ThreadTimes(NamedTuple):
    name: str
    user_ticks: int
    system_ticks: int
    voluntary_switches: int
    involuntary_switches: int


def thread_times():
    """{tid: ThreadTimes} for every thread of this process: CPU clock ticks (user, system) and
    context switches (voluntary, involuntary)."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/self/task/{tid}/status") as f:
                switches = {k: int(v) for k, v in (line.split(":", 1) for line in f if "ctxt_switches" in line)}
        except OSError:  # the thread ended meanwhile
            continue
        out[tid] = ThreadTimes(name, int(fields[11]), int(fields[12]), switches["voluntary_ctxt_switches"],
                               switches["nonvoluntary_ctxt_switches"])
    return out


def thread_counters():
    """{tid: (name, CPU clock ticks, voluntary + involuntary context switches)} for every thread
    of this process."""
    return {tid: (t.name, t.user_ticks + t.system_ticks, t.voluntary_switches + t.involuntary_switches)
            for tid, t in thread_times().items()}


def context_switches(thread_name):
    """Context switches so far of this process's threads named `thread_name`, together."""
    return sum(switches for name, _, switches in thread_counters().values() if name == thread_name)
