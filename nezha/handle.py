"""Handles returned by the asynchronous collectives."""
from __future__ import annotations

import time
from typing import Any, Callable, List, Optional, Sequence

from . import _core

NezhaError = _core.NezhaError

_WAIT_SLICE_S = 0.1  # wait in slices so Ctrl-C reaches Python promptly


class Handle:
    """An operation in flight. ``wait()`` returns its result or raises ``NezhaError``.

    Dropping a handle is legal: the engine keeps the operation's buffers alive until it is done with
    them (the native operation holds them, not this object); the result is then never observed.
    """

    def __init__(self, core_handles: Sequence[Any], finish: Callable[[], Any],
                 names: List[str]) -> None:
        self._core = list(core_handles)
        self._finish = finish
        self._names = names
        self._result: Any = None
        self._done = False
        self._error: Optional[str] = None

    def poll(self) -> bool:
        """True once every part of the operation has finished (successfully or not)."""
        return self._done or all(h.poll() for h in self._core)

    def wait(self, timeout_s: Optional[float] = None) -> Any:
        """Blocks until the operation finishes and returns its result.

        Raises ``NezhaError`` if the operation failed, or if ``timeout_s`` passed first (the
        operation then continues in the background).
        """
        if self._done:
            if self._error:
                raise NezhaError(self._error)
            return self._result
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for h in self._core:
            while not h.wait(_WAIT_SLICE_S if deadline is None
                             else max(0.0, min(_WAIT_SLICE_S, deadline - time.monotonic()))):
                if deadline is not None and time.monotonic() >= deadline:
                    raise NezhaError(f"timed out after {timeout_s} s waiting for "
                                     f"{', '.join(repr(n) for n in self._names[:4])}")
        errors = [h.error for h in self._core if h.error]
        self._done = True
        if errors:
            self._error = errors[0]
            self._core = []
            raise NezhaError(self._error)
        self._result = self._finish()
        self._core = []
        return self._result

    def __repr__(self) -> str:
        state = "done" if self.poll() else "pending"
        return f"<nezha.Handle {self._names[0] if self._names else ''} {state}>"
