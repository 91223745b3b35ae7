"""Completing the "nezha" process group's works as the engine finishes their operations.

One thread (``nz-torch-done``) waits on a ``_core.CompletionQueue``, into which the engine pushes
a token as each operation finishes: works complete in the order the engine finishes them, never in
submission order (an earlier receive may need a later send of this very rank), and the thread
sleeps while nothing finishes or times out. What completes a work (delivering its outputs, then
its future's callbacks, which torch runs inline) runs on settler threads: a callback may itself
wait for another work (PowerSGD's DDP hook waits, inside a ``then()``, for an allreduce it starts),
so a settler is added whenever every settler is busy, and no completion waits behind a blocked
one.
"""
from __future__ import annotations

import collections
import heapq
import itertools
import logging
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from nezha import _core

log = logging.getLogger("nezha")

_MAX_SETTLERS = 256  # beyond this many callbacks blocked at once, completions queue up
_WAKE = 0  # a token no work has: wakes the thread to recompute its next deadline


class _Settlers:
    """Threads that run completions, one more whenever all are busy (module docstring)."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._jobs: collections.deque = collections.deque()
        self._threads: List[threading.Thread] = []
        self._idle = 0
        self._stopping = False

    def submit(self, job: Callable[[], None]) -> None:
        with self._cv:
            self._jobs.append(job)
            if self._idle == 0 and len(self._threads) < _MAX_SETTLERS:
                thread = threading.Thread(target=self._serve, name="nz-torch-done", daemon=True)
                self._threads.append(thread)
                thread.start()
            else:
                self._cv.notify()

    def stop(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        for thread in self._threads:
            thread.join(timeout=10)

    def _serve(self) -> None:
        while True:
            with self._cv:
                while not self._jobs and not self._stopping:
                    self._idle += 1
                    self._cv.wait()
                    self._idle -= 1
                if not self._jobs:
                    return
                job = self._jobs.popleft()
            try:
                job()
            except Exception:  # a work's completion must never end the thread
                log.exception("completing a torch.distributed work failed")


class Completer:
    """Tracks works until their operations finish or their timeouts pass."""

    def __init__(self) -> None:
        self._queue = _core.CompletionQueue()
        self._lock = threading.Lock()
        self._tokens = itertools.count(1)
        self._pending: Dict[int, List[Any]] = {}  # token -> [work, parts left]
        self._deadlines: List[tuple] = []  # heap of (deadline, token)
        self._settlers = _Settlers()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="nz-torch-done", daemon=True)
        self._thread.start()

    def track(self, work: Any, handle: Any) -> None:
        """Completes `work` (its ``_complete()``) once every part of `handle` has finished, or
        fails it (``_expire()``) at its timeout."""
        parts = handle.parts()
        if not parts:  # nothing in flight (waited for already)
            self._settlers.submit(work._complete)
            return
        token = next(self._tokens)
        deadline = time.monotonic() + work._timeout_s
        with self._lock:
            self._pending[token] = [work, len(parts)]
            earliest = not self._deadlines or deadline < self._deadlines[0][0]
            heapq.heappush(self._deadlines, (deadline, token))
        if earliest:  # the thread may be asleep until a later deadline: let it look again
            self._queue.push(_WAKE)
        for part in parts:
            part.notify(self._queue, token)

    def stop(self, why: str) -> None:
        """Ends the threads; works still pending fail with `why`."""
        self._stopping = True
        self._queue.close()
        self._thread.join(timeout=10)
        with self._lock:
            left = [entry[0] for entry in self._pending.values()]
            self._pending.clear()
        for work in left:
            work._fail(why)
        self._settlers.stop()

    def _run(self) -> None:
        while not self._stopping:
            for token in self._queue.pop(self._until_next_deadline()):
                with self._lock:
                    entry = self._pending.get(token)
                    if entry is None:  # expired before it finished
                        continue
                    entry[1] -= 1
                    if entry[1] > 0:
                        continue
                    del self._pending[token]
                self._settlers.submit(entry[0]._complete)
            now = time.monotonic()
            with self._lock:
                while self._deadlines and self._deadlines[0][0] <= now:
                    _, token = heapq.heappop(self._deadlines)
                    entry = self._pending.pop(token, None)
                    if entry is not None:
                        self._settlers.submit(entry[0]._expire)

    def _until_next_deadline(self) -> float:
        with self._lock:
            while self._deadlines and self._deadlines[0][1] not in self._pending:
                heapq.heappop(self._deadlines)
            return (max(0.0, self._deadlines[0][0] - time.monotonic()) if self._deadlines
                    else 3600.0)


_instance: Optional[Completer] = None
_instance_lock = threading.Lock()


def completer() -> Completer:
    """The process's completer, started on first use."""
    global _instance
    with _instance_lock:
        if _instance is None:
            _instance = Completer()
        return _instance


def stop_completing(why: str) -> None:
    """Stops the completer's threads (a later work starts another); pending works fail with
    `why`. For the end of the default process group, which leaves no thread behind."""
    global _instance
    with _instance_lock:
        instance, _instance = _instance, None
    if instance is not None:
        instance.stop(why)
