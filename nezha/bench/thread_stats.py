"""This process's threads, from /proc (Linux): CPU time and context switches, by thread name.

The engine's threads are named (nz-engine, nz-rail, nz-watchdog, ...: common/thread_name.h), so
these tell the engine's share of a small operation's cost from the framework's
(benchmarks/small_op_threads.py) and show whether a thread slept through a run (tests).
"""
import os


def thread_counters():
    """{tid: (name, CPU clock ticks, voluntary + involuntary context switches)} for every thread
    of this process."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/self/task/{tid}/status") as f:
                switches = sum(int(line.split()[1]) for line in f if "ctxt_switches" in line)
        except OSError:  # the thread ended meanwhile
            continue
        out[tid] = (name, int(fields[11]) + int(fields[12]), switches)
    return out


def context_switches(thread_name):
    """Context switches so far of this process's threads named `thread_name`, together."""
    return sum(switches for name, _, switches in thread_counters().values() if name == thread_name)
