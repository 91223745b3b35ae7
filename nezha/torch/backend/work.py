"""The work objects the "nezha" process group returns, as torch.distributed expects them.

A ``NezhaWork`` is one operation: ``wait(timeout)``, ``is_completed()``, ``is_success()``,
``exception()``, ``result()`` (the output tensors) and ``get_future()``, a ``torch.futures.Future``
whose value is the list of output tensors (DDP's comm hooks read ``fut.value()[0]``).

completion.py completes them as the engine finishes their operations, and enforces each work's
timeout (the group's, or the operation's own): a work not finished by then fails with an error
naming it, and the operation goes on in the engine.
"""
from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any, Callable, List, Optional

import torch
import torch.distributed as dist

import nezha
from nezha.handle import Handle
from nezha.torch.backend.completion import completer

_WAIT_SLICE_S = 0.1  # waits in slices so Ctrl-C reaches Python promptly


_settling = threading.Lock()


class NezhaBackendError(dist.DistBackendError, nezha.NezhaError):
    """An operation of the "nezha" process group failed: a ``torch.distributed.DistBackendError``
    (what torch's own backends raise) and a ``nezha.NezhaError``; the message names the operation,
    its tensor and what the engine reported (ranks, rail)."""


class NezhaWork(dist.Work):
    """One operation of a nezha process group (see the module's docstring)."""

    def __init__(self, what: str, timeout_s: float) -> None:
        super().__init__()
        self._what = what
        self._timeout_s = timeout_s
        self._done = threading.Event()
        self._future: torch.futures.Future = torch.futures.Future()
        self._outputs: List[torch.Tensor] = []
        self._error: Optional[BaseException] = None
        self._handle: Optional[Handle] = None
        self._finish: Optional[Callable[[Any], List[torch.Tensor]]] = None
        self._members: List["NezhaWork"] = []
        self._parts: List[Any] = []  # the engine's handles, which a waiter watches itself
        self._settled = False
        # Set between start_coalescing and end_coalescing: the operation is not submitted yet,
        # and a wait() returns at once, as a coalesced operation's work does in torch's own
        # backends (the coalesced group's work, from end_coalescing, is the one to wait for).
        self.coalescing = False
        self._tracked = True  # by the completer (start's waited_at_once says otherwise)
        self._started_at = 0.0

    def start(self, handle: Handle, finish: Callable[[Any], List[torch.Tensor]],
              members: List["NezhaWork"] = (), waited_at_once: bool = False) -> "NezhaWork":
        """Binds the engine's handle; ``finish(handle's result)`` delivers the output tensors.
        ``members``: works this one carries (coalesced operations), failed with it if it fails
        (its finish completes them when it succeeds). ``waited_at_once``: the caller waits for it
        before anything else sees it (a synchronous torch call), so the completer does not track it:
        its waiter completes it and keeps its timeout, and the completer's threads are not woken
        for it (get_future() and is_completed() still work)."""
        self._handle, self._finish, self._members = handle, finish, list(members)
        self._parts = handle.parts()
        self.coalescing = False
        self._started_at = time.monotonic()
        self._tracked = not waited_at_once
        if self._tracked:
            completer().track(self, handle)
        return self

    def _track_late(self) -> None:
        """An untracked work that someone other than its waiter looks at: tracked from now on."""
        with _settling:  # the handle as it is now: a waiter completing meanwhile clears it
            handle = self._handle if not self._tracked else None
            self._tracked = True
        if handle is not None:
            completer().track(self, handle)

    def finish_now(self, outputs: List[torch.Tensor]) -> "NezhaWork":
        """Completes a work that needed no communication (a group of one)."""
        self._settle(outputs, None)
        return self

    # --- torch.distributed.Work -----------------------------------------------------------------

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        if self.coalescing:
            return True
        limit = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout or 0)
        deadline = time.monotonic() + limit if limit > 0 else None
        # Untracked (waited_at_once): the work's own timeout is this waiter's to keep.
        own_deadline = None if self._tracked else self._started_at + self._timeout_s

        def waited_out():
            if own_deadline is not None and time.monotonic() >= own_deadline:
                self._expire()
            if deadline is not None and time.monotonic() >= deadline:
                raise NezhaBackendError(f"{self._what}: not finished within {limit:g} s (wait's "
                                        "timeout; the operation goes on)")

        # The waiter watches the engine's handles itself and completes the work on its own
        # thread as soon as they finish (a synchronous call then costs no hand-over to the
        # completer's threads); whichever of the two gets there first completes it.
        for part in self._parts:
            while not self._done.is_set() and not part.wait(_WAIT_SLICE_S):
                waited_out()
        if not self._done.is_set():  # every part has finished (none left: waited for already)
            self._complete()
        while not self._done.wait(_WAIT_SLICE_S):
            waited_out()
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        if not self._tracked and not self._done.is_set() and all(p.poll() for p in self._parts):
            self._complete()
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._done.is_set() and self._error is None

    def exception(self) -> Optional[BaseException]:
        return self._error

    def result(self) -> List[torch.Tensor]:
        self.wait()
        return self._outputs

    def get_future(self) -> torch.futures.Future:
        self._track_late()  # a future's callbacks must run without a waiter
        return self._future

    def synchronize(self) -> None:
        self.wait()

    def __repr__(self) -> str:
        state = "failed" if self._error else "done" if self._done.is_set() else "pending"
        return f"<NezhaWork {self._what} {state}>"

    # --- completion (the completer's thread) ------------------------------------------------------

    def _take_handle(self) -> bool:
        """True for the one caller that gets to complete the work: its waiter or the completer,
        on success, failure or timeout."""
        with _settling:
            taken = self._handle is not None
            self._handle = None
            return taken

    def _complete(self) -> None:
        handle, finish = self._handle, self._finish
        if not self._take_handle():
            return
        self._finish = None
        try:
            outputs = finish(handle.wait(0))
        except Exception as exc:  # the engine's failure, or delivering the result failed
            self._settle([], NezhaBackendError(f"{self._what} failed: {exc}"))
        else:
            self._settle(outputs, None)

    def _fail(self, why: str) -> None:
        if self._take_handle():
            self._settle([], NezhaBackendError(f"{self._what}: {why}"))

    def _expire(self) -> None:
        if self._take_handle():
            self._settle([], NezhaBackendError(
                f"{self._what}: timed out after {self._timeout_s:g} s (the process group's or "
                "the operation's timeout expired); a rank that never submitted it, or a peer much "
                "slower than the others, holds it up"))

    def _settle(self, outputs: List[torch.Tensor], error: Optional[BaseException]) -> None:
        with _settling:  # the first settle wins (a timeout and the operation's end may race)
            if self._settled:
                return
            self._settled = True
        self._outputs, self._error = outputs, error
        # The future first: whoever wait() releases may read get_future().value() at once.
        if error is None:
            self._future.set_result(outputs)
        else:
            self._future.set_exception(error)
        self._done.set()
        for member in self._members if error is not None else ():
            member._settle([], error)
