"""Tears down live testbeds when the process exits: normally (atexit), or on SIGINT/SIGTERM.

The signal handlers tear down first and then hand the signal to whatever handler was installed
before (Python's KeyboardInterrupt, a framework's handler, or the default action, which is
re-raised so the exit status still says "killed by SIGTERM").
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading

_lock = threading.RLock()  # re-entrant: a signal handler may run while the main thread holds it
_live: dict = {}  # id(testbed) -> testbed
_installed = False
_previous_handlers: dict = {}
_HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def register(testbed) -> None:
    global _installed
    with _lock:
        _live[id(testbed)] = testbed
        if _installed:
            return
        _installed = True
    atexit.register(teardown_all)
    if threading.current_thread() is threading.main_thread():
        for sig in _HANDLED_SIGNALS:
            _previous_handlers[sig] = signal.signal(sig, _on_signal)


def unregister(testbed) -> None:
    with _lock:
        _live.pop(id(testbed), None)


def teardown_all() -> None:
    with _lock:
        testbeds = list(_live.values())
    for testbed in testbeds:
        try:
            testbed.down()
        except Exception as exc:  # keep tearing down the others; this runs at exit
            print(f"nezha.testbed: teardown of {testbed.prefix!r} failed: {exc}", file=sys.stderr)


def _on_signal(signum, frame) -> None:
    teardown_all()
    previous = _previous_handlers.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    # SIG_IGN: the process had chosen to ignore it; the testbeds are gone, carry on.
