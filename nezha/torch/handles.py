"""Handles of asynchronous torch collectives: `poll(handle)` and `synchronize(handle)`."""

import time


class Handle:
    """What the `*_async` functions return.

    Wraps the engine's handle together with `finish`, which turns the engine's result into the
    torch result (copies a staged result back to the GPU, writes into the caller's tensor, ...).
    Until then it keeps the input and staging tensors alive, because the engine reads and writes
    their memory asynchronously.
    """

    __slots__ = ("_engine_handle", "_finish", "_keepalive", "_result", "_done", "_error")

    def __init__(self, engine_handle, finish, keepalive=()):
        self._engine_handle = engine_handle
        self._finish = finish
        self._keepalive = keepalive
        self._result = None
        self._done = False
        self._error = None

    def poll(self):
        """True when `wait()` would return without blocking."""
        return self._done or self._error is not None or bool(self._engine_handle.poll())

    def wait(self, timeout_s=None):
        """The op's torch result; raises NezhaError (every time) if the op failed."""
        if self._error is not None:
            raise self._error
        if not self._done:
            try:
                engine_result = self._engine_handle.wait(timeout_s)
                self._result = self._finish(engine_result)
            except BaseException as error:
                self._error = error
                raise
            finally:
                self._engine_handle = self._finish = self._keepalive = None
            self._done = True
        return self._result


class CompositeHandle:
    """Several handles waited as one (ops Nezha's API has no grouped form of); result is a list."""

    __slots__ = ("_handles", "_combine")

    def __init__(self, handles, combine=list):
        self._handles = list(handles)
        self._combine = combine

    def poll(self):
        return all(h.poll() for h in self._handles)

    def wait(self, timeout_s=None):
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        results = []
        for h in self._handles:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            results.append(h.wait(left))
        return self._combine(results)


def poll(handle):
    """Horovod's `poll`: True when the asynchronous op behind `handle` has finished."""
    return handle.poll()


def synchronize(handle, timeout_s=None):
    """Horovod's `synchronize`: waits for the op and returns its result (NezhaError on failure)."""
    if handle is None:
        raise ValueError("synchronize() needs a handle returned by an *_async function")
    return handle.wait(timeout_s)


__all__ = ["Handle", "CompositeHandle", "poll", "synchronize"]
