"""Spawning ranks, forwarding their output line by line, and stopping the job as one unit.

Each rank runs in its own session (process group), so a rank's helper processes are stopped with
it and a Ctrl-C on the terminal reaches only nezharun, which then stops the ranks in order:
SIGTERM to every group, SIGKILL to whatever is left after a grace period. One thread per rank
waits on the process and reports its exit on a queue; the supervisor blocks on that queue with
deadlines, so nothing polls.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import BinaryIO, Callable, Dict, List, Optional, Set

from nezha.runner.commands import RankCommand

STOP_GRACE_S = 5.0
_READER_JOIN_S = 2.0
_KILL_WAIT_S = 10.0  # SIGKILL is final; this only bounds a process stuck in the kernel
_MAX_LINE_BYTES = 64 * 1024
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(Exception):
    """nezharun itself received SIGINT, SIGTERM or SIGHUP."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclasses.dataclass
class Outcome:
    """How the job ended: nezharun's exit code and, on failure, the one-line reason."""

    exit_code: int
    reason: Optional[str] = None


class OutputSink:
    """Writes whole prefixed lines to nezharun's stdout/stderr; one lock keeps lines intact."""

    def __init__(self, stdout: Optional[BinaryIO] = None, stderr: Optional[BinaryIO] = None):
        self._streams = {"stdout": stdout or _binary(sys.stdout),
                         "stderr": stderr or _binary(sys.stderr)}
        self._lock = threading.Lock()

    def write_line(self, stream: str, line: bytes) -> None:
        with self._lock:
            out = self._streams[stream]
            out.write(line)
            out.flush()


def _binary(text_stream) -> BinaryIO:
    return getattr(text_stream, "buffer", text_stream)


def exit_code_of(returncode: int) -> int:
    """Shell convention: a rank killed by signal N counts as exit code 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def describe_exit(returncode: int) -> str:
    """``exited with code 3`` or ``was killed by SIGKILL (exit code 137)``."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name} (exit code {exit_code_of(returncode)})"
    return f"exited with code {returncode}"


class _Rank:
    def __init__(self, command: RankCommand, process: subprocess.Popen, sink: OutputSink,
                 exits: "queue.Queue[int]") -> None:
        self.command = command
        self.process = process
        rank = command.placement.rank
        self.readers = [
            threading.Thread(target=_forward_lines, name=f"nezharun-rank{rank}-{name}",
                             args=(stream, f"[{rank}]<{name}>: ".encode(), name, sink),
                             daemon=True)
            for name, stream in (("stdout", process.stdout), ("stderr", process.stderr))]
        for reader in self.readers:
            reader.start()
        self.waiter = threading.Thread(target=lambda: (process.wait(), exits.put(rank)),
                                       name=f"nezharun-rank{rank}-wait", daemon=True)
        self.waiter.start()

    @property
    def running(self) -> bool:
        return self.process.returncode is None

    def signal_group(self, signum: int) -> None:
        try:
            os.killpg(self.process.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass  # already gone

    def join_output(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for reader in self.readers:
            reader.join(max(0.0, deadline - time.monotonic()))


def _forward_lines(stream: BinaryIO, prefix: bytes, name: str, sink: OutputSink) -> None:
    with stream:
        for line in iter(lambda: stream.readline(_MAX_LINE_BYTES), b""):
            sink.write_line(name, prefix + (line if line.endswith(b"\n") else line + b"\n"))


class Supervisor:
    """Runs every rank to completion; the first failure stops the others.

    ``arrived()`` returns the ranks that have reached the rendezvous store; it is consulted once,
    when ``start_timeout_s`` expires, to name the ranks that never did.
    """

    def __init__(self, commands: List[RankCommand], sink: OutputSink,
                 stop_grace_s: float = STOP_GRACE_S) -> None:
        self._commands = commands
        self._sink = sink
        self._grace_s = stop_grace_s
        self._exits: "queue.Queue[int]" = queue.Queue()
        self._ranks: Dict[int, _Rank] = {}

    def run(self, start_timeout_s: Optional[float] = None,
            arrived: Callable[[], Set[int]] = lambda: set()) -> Outcome:
        """Spawns all ranks and waits; returns the job's outcome. Always leaves no rank running."""
        previous = {}
        if threading.current_thread() is threading.main_thread():
            # Installed explicitly: a shell starting nezharun in the background ignores SIGINT,
            # and nezharun must still stop its ranks on it.
            previous = {s: signal.signal(s, _raise_interrupted) for s in _STOP_SIGNALS}
        try:
            failure = self._spawn_all()
            if failure is None:
                failure = self._wait(start_timeout_s, arrived)
            return failure
        except (KeyboardInterrupt, Interrupted) as exc:
            signum = exc.signum if isinstance(exc, Interrupted) else int(signal.SIGINT)
            stopped = self._stop_running()
            return Outcome(128 + signum, f"interrupted by {signal.Signals(signum).name}; stopped "
                                         f"{_ranks_count(stopped)}")
        finally:
            self._stop_running()  # no-op unless an unexpected error got us here
            for r in self._ranks.values():
                r.join_output(_READER_JOIN_S)
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _spawn_all(self) -> Optional[Outcome]:
        for command in self._commands:
            p = command.placement
            try:
                process = subprocess.Popen(
                    command.argv, env=command.env, start_new_session=True,
                    stdin=subprocess.PIPE if command.stdin_data is not None else subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            except OSError as exc:
                stopped = self._stop_running()
                return Outcome(127, f"rank {p.rank} on host {p.host} could not start "
                                    f"{command.argv[0]!r}: {exc.strerror}; stopped "
                                    f"{_ranks_count(stopped, other=True)}")
            if command.stdin_data is not None:
                try:
                    process.stdin.write(command.stdin_data)
                    process.stdin.close()
                except OSError:
                    pass  # the launcher died at once; its exit code tells the story
            self._ranks[p.rank] = _Rank(command, process, self._sink, self._exits)
        return None

    def _wait(self, start_timeout_s: Optional[float], arrived) -> Outcome:
        start_deadline = None if start_timeout_s is None else time.monotonic() + start_timeout_s
        remaining = set(self._ranks)
        while remaining:
            timeout = None if start_deadline is None else max(0.0,
                                                             start_deadline - time.monotonic())
            try:
                rank = self._exits.get(timeout=timeout)
            except queue.Empty:
                start_deadline = None
                late = sorted(r for r in remaining if r not in arrived())
                if late:
                    stopped = self._stop_running()
                    return Outcome(124, f"{_rank_list(late)} did not reach the rendezvous store "
                                        f"within {start_timeout_s:g} s; stopped "
                                        f"{_ranks_count(stopped)}")
                continue
            remaining.discard(rank)
            r = self._ranks[rank]
            if r.process.returncode != 0:
                stopped = self._stop_running()
                r.join_output(_READER_JOIN_S)  # its last words come before the verdict
                p = r.command.placement
                return Outcome(exit_code_of(r.process.returncode),
                               f"rank {p.rank} on host {p.host} "
                               f"{describe_exit(r.process.returncode)}; stopped "
                               f"{_ranks_count(stopped, other=True)}")
        return Outcome(0)

    def _stop_running(self) -> List[int]:
        """SIGTERM to every running rank's group, SIGKILL after the grace period; returns the
        ranks that were still running."""
        running = [r for r in self._ranks.values() if r.running]
        for r in running:
            r.signal_group(signal.SIGTERM)
        self._await_exits(running, self._grace_s)
        for r in running:
            # Also reaches helpers left behind in the group of a rank that did exit on SIGTERM.
            r.signal_group(signal.SIGKILL)
        self._await_exits(running, _KILL_WAIT_S)
        return [r.command.placement.rank for r in running]

    def _await_exits(self, ranks: List["_Rank"], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while any(r.running for r in ranks):
            try:
                self._exits.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return


def _raise_interrupted(signum, _frame):
    raise Interrupted(signum)


def _rank_list(ranks: List[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _ranks_count(ranks: List[int], other: bool = False) -> str:
    noun = "rank" if len(ranks) == 1 else "ranks"
    return f"{len(ranks)} {'other ' if other else ''}{noun}"
