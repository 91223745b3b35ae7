"""The one Handle every asynchronous collective returns, in every adapter; poll and synchronize."""
from __future__ import annotations

import time
from typing import Any, Callable, Iterable, List, Optional, Sequence

from . import _core

NezhaError = _core.NezhaError

_WAIT_SLICE_S = 0.1  # wait in slices so Ctrl-C reaches Python promptly


class Handle:
    """An operation in flight. ``wait()`` returns its result or raises.

    ``parts`` are the engine's handles of the operation (one per tensor); ``finish`` turns them,
    once all are done, into the caller's result (a numpy view, a torch tensor copied back to its
    GPU, ...). The finish step is also the keep-alive: what it references (staging buffers, the
    caller's tensors) lives until it has run, then is released with the engine handles. Buffers
    handed to the engine need no keep-alive: the native operation owns them, so dropping a handle
    is legal (the operation completes and its result is never observed).

    Once the operation failed, or its finish step raised, every ``wait()`` raises that same
    exception. A timeout is no failure: the operation goes on and may be waited for again.
    """

    __slots__ = ("_parts", "_finish", "_names", "_result", "_error", "_done")

    def __init__(self, parts: Sequence[Any], finish: Callable[[], Any], names: List[str]) -> None:
        self._parts = list(parts)
        self._finish = finish
        self._names = names
        self._result: Any = None
        self._error: Optional[BaseException] = None
        self._done = False

    def parts(self) -> List[Any]:
        """The engine's handles of the operation, one per tensor (what a completion queue
        watches: ``OpHandle.notify``); empty once the operation has been waited for."""
        return list(self._parts)

    def poll(self) -> bool:
        """True once every part of the operation has finished (successfully or not)."""
        return self._done or all(p.poll() for p in self._parts)

    def wait(self, timeout_s: Optional[float] = None) -> Any:
        """Blocks until the operation finishes and returns its result.

        Raises ``NezhaError`` if the operation failed, or if ``timeout_s`` passed first (the
        operation then continues in the background).
        """
        if not self._done:
            self._wait_parts(timeout_s)
            errors = [p.error for p in self._parts if p.error]
            try:
                if errors:
                    raise NezhaError(errors[0])
                result = self._finish()
            except Exception as error:  # KeyboardInterrupt leaves it pending: wait() may resume
                self._settle(None, error)
                raise
            self._settle(result, None)
        if self._error is not None:
            raise self._error
        return self._result

    __call__ = wait  # Horovod's sparse_allreduce_async returns a function to call for the result

    def then(self, step: Callable[[Any], Any]) -> "Handle":
        """A handle of the same operation whose result is ``step(this handle's result)``: how an
        adapter delivers results in its framework's types. Wait on the new handle only."""
        return Handle(self._parts, lambda: step(self.wait()), self._names)

    @staticmethod
    def gather(handles: Iterable["Handle"], combine: Callable[[List[Any]], Any] = list) -> "Handle":
        """One handle for several operations: done when all are, its result
        ``combine([each result])`` (a list by default)."""
        handles = list(handles)
        return Handle([p for h in handles for p in h._parts],
                      lambda: combine([h.wait() for h in handles]),
                      [n for h in handles for n in h._names])

    def _wait_parts(self, timeout_s: Optional[float]) -> None:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for p in self._parts:
            while not p.wait(_WAIT_SLICE_S if deadline is None
                             else max(0.0, min(_WAIT_SLICE_S, deadline - time.monotonic()))):
                if deadline is not None and time.monotonic() >= deadline:
                    raise NezhaError(f"timed out after {timeout_s} s waiting for "
                                     f"{', '.join(repr(n) for n in self._names[:4])}")

    def _settle(self, result: Any, error: Optional[BaseException]) -> None:
        self._result, self._error, self._done = result, error, True
        self._parts, self._finish = [], None  # releases the engine handles and what finish kept

    def __repr__(self) -> str:
        state = "done" if self.poll() else "pending"
        return f"<nezha.Handle {self._names[0] if self._names else ''} {state}>"


def poll(handle: Handle) -> bool:
    """True once the operation behind ``handle`` has finished (Horovod's ``poll``)."""
    return handle.poll()


def synchronize(handle: Handle, timeout_s: Optional[float] = None) -> Any:
    """Waits for ``handle`` and returns its result; raises NezhaError if it failed (Horovod's
    ``synchronize``, with an optional timeout)."""
    if handle is None:
        raise ValueError("synchronize() needs a handle returned by an *_async function")
    return handle.wait(timeout_s)
