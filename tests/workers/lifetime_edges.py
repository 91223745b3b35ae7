"""Lifetime edges of in-flight operations, each ending in a clear error or a clean exit.

usage: lifetime_edges.py MODE
  edges     a duplicate name in flight, a grouped submission failing half-way, a mismatch and a user
            exception with their handles dropped, shutdown() with operations in flight (then init()
            again); the job goes on in step after each, results checked against numpy
  exit      operations in flight, handles dropped, and the interpreter exits without shutdown()
  deadpeer  rank 1 dies while rank 0 has operations in flight whose handles it dropped
"""
import gc
import os
import sys
import time

import numpy as np

import nezha

MODE = sys.argv[1]
nezha.init()
RANK, SIZE = nezha.rank(), nezha.size()
print("READY", flush=True)
BIG = 1 << 20  # float32 elements: on the rails, not done by rank 0 within negotiation


def data(i, rank, n=BIG):
    return ((np.arange(n) * 3 + i * 7 + rank) % 17).astype(np.float32)


def check_in_step(tag):
    """A collective every rank runs next: the job is usable and in step."""
    got = nezha.allreduce(data(tag, RANK, 1000), op=nezha.Sum, name=f"in_step.{tag}")
    assert np.array_equal(got, sum(data(tag, r, 1000) for r in range(SIZE))), tag


def expect_raises(exc, match, fn):
    try:
        fn()
    except exc as e:
        assert match in str(e), f"rank {RANK}: '{match}' not in: {e}"
        return e
    raise AssertionError(f"rank {RANK}: expected {exc.__name__} matching '{match}'")


def duplicate_name_in_flight():
    if RANK == 1:
        time.sleep(0.3)  # keeps rank 0's 'dup' in flight while it reuses the name
    h = nezha.allreduce_async(data(1, RANK), op=nezha.Sum, name="dup")
    if RANK == 0:
        expect_raises(ValueError, "already in flight",
                      lambda: nezha.allreduce_async(data(2, RANK), name="dup"))
    del h
    gc.collect()
    check_in_step(1)


def grouped_fails_half_way():
    good = [data(3, RANK, 100), data(4, RANK, 200)]
    expect_raises((TypeError, ValueError), "dtype", lambda: nezha.grouped_allreduce_async(
        good + [np.ones(3, np.complex64)], op=nezha.Sum, name="grp"))
    expect_raises((TypeError, ValueError), "contiguous", lambda: nezha.grouped_allreduce_async(
        good + [np.ones((4, 4), np.float32)[:, ::2]], op=nezha.Sum, name="grp"))
    # No member of the failed submissions was left in flight: the name is free on every rank.
    got = nezha.grouped_allreduce(good, op=nezha.Sum, name="grp")
    for g, i, n in zip(got, (3, 4), (100, 200)):
        assert np.array_equal(g, sum(data(i, r, n) for r in range(SIZE)))
    check_in_step(2)


def failures_with_dropped_handles():
    nezha.allreduce_async(np.ones(3 + RANK, np.float32), name="mismatch.dropped")  # dropped
    err = expect_raises(nezha.NezhaError, "mismatch.kept",
                        lambda: nezha.allreduce(np.ones(2 + RANK, np.float32), name="mismatch.kept"))
    print(f"mismatch raised: {err}", flush=True)
    try:
        h = nezha.allreduce_async(data(5, RANK), name="user_exception")
        raise RuntimeError("user code failed between collectives")
    except RuntimeError:
        pass  # the handle went with the frame
    del h
    gc.collect()
    check_in_step(3)


def shutdown_in_flight():
    kept = [nezha.allreduce_async(data(10 + i, RANK), op=nezha.Sum, name=f"sd.{i}") for i in range(3)]
    for i in range(3, 6):
        nezha.allgather_async(data(10 + i, RANK, 1000), name=f"sd.{i}")  # dropped
    lonely = nezha.allreduce_async(data(20, RANK), name=f"sd.only_rank_{RANK}")  # never matched
    start = time.monotonic()
    nezha.shutdown()
    for i, h in enumerate(kept):  # finished before the shutdown agreement, or failed: never hung
        try:
            assert np.array_equal(h.wait(30), sum(data(10 + i, r) for r in range(SIZE)))
        except nezha.NezhaError as e:
            print(f"sd.{i} failed at shutdown: {e}", flush=True)
    expect_raises(nezha.NezhaError, "shut down", lambda: lonely.wait(30))
    print(f"shutdown with operations in flight took {time.monotonic() - start:.2f} s", flush=True)
    nezha.init()
    check_in_step(4)


if MODE == "edges":
    duplicate_name_in_flight()
    grouped_fails_half_way()
    failures_with_dropped_handles()
    shutdown_in_flight()
    nezha.shutdown()
    print(f"OK rank {RANK}", flush=True)
elif MODE == "exit":
    for i in range(8):
        nezha.allreduce_async(data(i, RANK), name=f"exit.{i}")  # dropped, still in flight at exit
    print(f"OK rank {RANK}: exiting without shutdown()", flush=True)
elif MODE == "deadpeer":
    nezha.barrier()
    if RANK == 1:
        time.sleep(0.5)  # rank 0's operations below are in flight, waiting for this rank
        os._exit(3)
    for i in range(4):
        nezha.allreduce_async(data(i, RANK), name=f"dead.{i}")  # dropped
    gc.collect()
    start = time.monotonic()
    # Submitting or waiting raises, naming the rank, within NEZHA_TIMEOUT_S.
    err = expect_raises(nezha.NezhaError, "rank 1", lambda: [
        nezha.allreduce(data(9 + i, RANK), name=f"after.{i}") for i in range(100)])
    print(f"OK rank {RANK}: raised after {time.monotonic() - start:.1f} s: {err}", flush=True)
