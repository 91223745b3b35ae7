"""nezha.Handle, the one handle of every adapter, on fake engine handles (one process, no job)."""
import gc
import threading
import weakref

import pytest

import nezha
from nezha.handle import Handle, poll, synchronize


class FakePart:
    """Stands in for the engine's OpHandle: finishes when `finish()` is called (or at once)."""

    def __init__(self, error="", done=False):
        self.error = error
        self._done = threading.Event()
        self.waits = 0
        if done:
            self._done.set()

    def finish(self):
        self._done.set()

    def poll(self):
        return self._done.is_set()

    def wait(self, timeout_s):
        self.waits += 1
        return self._done.wait(timeout_s)


def test_wait_runs_finish_once_and_returns_its_result():
    calls = []
    part = FakePart(done=True)
    h = Handle([part], lambda: calls.append(1) or "result", ["t"])
    assert h.poll() and poll(h)
    assert h.wait() == "result" and synchronize(h) == "result" and h() == "result"
    assert calls == [1]


def test_a_failed_operation_raises_the_same_error_every_time():
    h = Handle([FakePart(done=True), FakePart("rank 1 died", done=True)], lambda: "never", ["t"])
    with pytest.raises(nezha.NezhaError, match="rank 1 died") as first:
        h.wait()
    with pytest.raises(nezha.NezhaError) as second:
        h.wait()
    assert second.value is first.value
    assert h.poll()


def test_a_failing_finish_step_is_raised_every_time():
    def finish():
        raise ValueError("cannot deliver")

    h = Handle([FakePart(done=True)], finish, ["t"])
    errors = []
    for _ in range(2):
        with pytest.raises(ValueError, match="cannot deliver") as info:
            h.wait()
        errors.append(info.value)
    assert errors[0] is errors[1]


def test_a_timeout_leaves_the_operation_pending():
    part = FakePart()
    h = Handle([part], lambda: 7, ["grad.w"])
    assert not h.poll()
    with pytest.raises(nezha.NezhaError, match="timed out after 0.05 s waiting for 'grad.w'"):
        h.wait(0.05)
    part.finish()
    assert h.wait(1.0) == 7


def test_waits_are_sliced_so_ctrl_c_is_seen():
    part = FakePart()
    threading.Timer(0.35, part.finish).start()
    assert Handle([part], lambda: None, ["t"]).wait() is None
    assert part.waits >= 3  # 0.1 s slices


def test_an_interrupted_wait_can_be_resumed():
    class Interrupting(FakePart):
        def wait(self, timeout_s):
            if self.waits == 0:
                self.waits += 1
                raise KeyboardInterrupt
            return super().wait(timeout_s)

    part = Interrupting(done=True)
    h = Handle([part], lambda: "ok", ["t"])
    with pytest.raises(KeyboardInterrupt):
        h.wait()
    assert h.wait() == "ok"


def test_finish_keeps_its_staging_alive_until_it_ran_then_releases_it():
    class Staging:
        pass

    staging = Staging()
    ref = weakref.ref(staging)
    part = FakePart()
    h = Handle([part], lambda s=staging: type(s).__name__, ["t"])
    del staging
    gc.collect()
    assert ref() is not None
    part.finish()
    assert h.wait() == "Staging"
    gc.collect()
    assert ref() is None


def test_then_and_gather_compose_results_of_one_operation():
    a, b = FakePart(), FakePart()
    ha = Handle([a], lambda: 2, ["a"]).then(lambda x: x * 10)
    hb = Handle([b], lambda: 3, ["b"])
    both = Handle.gather([ha, hb], combine=sum)
    a.finish()
    assert not both.poll()
    with pytest.raises(nezha.NezhaError, match="'a', 'b'"):
        both.wait(0.01)
    b.finish()
    assert both.poll() and both.wait() == 23
    assert Handle.gather([Handle([FakePart(done=True)], lambda: 1, ["c"])]).wait() == [1]


def test_a_failed_part_fails_the_gathered_handle():
    good, bad = FakePart(done=True), FakePart("mismatch on 'b'", done=True)
    both = Handle.gather([Handle([good], lambda: 1, ["a"]), Handle([bad], lambda: 2, ["b"])])
    with pytest.raises(nezha.NezhaError, match="mismatch on 'b'"):
        both.wait()


def test_synchronize_needs_a_handle():
    with pytest.raises(ValueError, match="handle"):
        synchronize(None)
