"""Collectives as their step schedules: how long one share takes on one rail.

Each function mirrors an algorithm of core/src/collectives (the step counts and the bytes each link
carries per step) and prices it on a `Link` at simulated times: a step costs the profile's per-step
time, its bytes through the link's token bucket, and the reduction the step does where the ring's
pipeline cannot hide it. Where several flows share a link in a step (a host's ranks on one NIC, the
aggregator's one link), their bytes add up on it: that is the contention the model knows.
"""
from __future__ import annotations

import math

SEGMENT_BYTES = 1 << 20          # NEZHA_SEGMENT_BYTES: the ring's pipeline unit
BROADCAST_FIRST_PIECE = 1 << 20  # collectives/broadcast.cc kFirstPieceWaitBytes
BROADCAST_MIN_PIECE = 16 << 10   # ... kMinPieceBytes
BROADCAST_CHAIN_PIECES = 4       # ... kChainPieces
BROADCAST_TREE_MAX = 64 << 10    # below this a broadcast goes down a binomial tree


class Link:
    """One rail's link, the same on every host (the schedules are symmetric): a token bucket that
    refills at `rate` up to `burst` bytes and sends from it at `line` speed (a `tc tbf` shaper on a
    veth; a real NIC has burst 0 and line = rate), a per-step software cost, and the host's
    reduction rate, all in bytes/s and seconds. Stateful: the bucket's fill carries over from one
    step, share and operation to the next on the simulated clock, so software time between
    transfers lets it refill as it does on the testbed. `cap` (bytes/s) bounds both speeds while
    the machine the hosts share is the bottleneck (set by the caller per share); a step lasts at
    least `cpu_s` while every host's workers share the machine's cores, and starts `wake_s` late
    where its processes outnumber them (both set likewise; 0 on own cores)."""

    def __init__(self, rate: float, step_s: float, reduce_rate: float, burst: float = 0.0, line: float = 0.0):
        self.rate, self.step_s, self.reduce_rate = rate, step_s, reduce_rate
        self.burst, self.line = burst, max(line, rate)
        self.tokens, self.last = burst, 0.0
        self.cap = float("inf")
        self.cpu_s = 0.0
        self.wake_s = 0.0

    def send(self, nbytes: float, at: float) -> float:
        """Seconds to move `nbytes` through the link starting at `at`."""
        if nbytes <= 0:
            return 0.0
        rate, line = min(self.rate, self.cap), min(self.line, self.cap)
        if at > self.last:
            self.tokens = min(self.burst, self.tokens + (at - self.last) * rate)
        from_bucket = min(self.tokens, nbytes)
        secs = from_bucket / line + (nbytes - from_bucket) / rate
        self.tokens -= from_bucket
        self.last = max(self.last, at + secs)
        return secs

    def step(self, nbytes: float, at: float, wakes: bool = True) -> float:
        """One message step from `at`: the wait for a core to wake on (`wake_s`, set by the caller
        where processes outnumber the shared cores; none where `wakes` is False), then its software
        cost and its bytes, or the CPU every worker's step needs of the shared cores, whichever is
        longer."""
        wake = self.wake_s if wakes else 0.0
        return wake + max(self.step_s + self.send(nbytes, at + wake + self.step_s), self.cpu_s)

    def step_from_idle_host(self, nbytes: float) -> float:
        """A step only the hosts otherwise idle in this operation send (a non-power-of-two job's
        extra ranks folding in): their buckets are full, and this link's is left to refill. No
        wait for a core (see fold_step)."""
        rate, line = min(self.rate, self.cap), min(self.line, self.cap)
        from_bucket = min(self.burst, nbytes)
        return max(self.step_s + from_bucket / line + (nbytes - from_bucket) / rate, self.cpu_s)

    def fold_step(self, nbytes: float, at: float) -> float:
        """The copy back to a non-power-of-two job's extra ranks. Neither fold step waits for a
        core: on the testbed a 4-16 KB allreduce of 6 or 12 hosts, two fold steps more than the
        log-step of 4 or 8, takes what the log-steps alone take at about its host count (6 hosts
        270 us, 8 hosts 450, 12 hosts 600: rank 0's share, one shaped rail)."""
        return self.step(nbytes, at, wakes=False)

    def reduce(self, nbytes: float) -> float:
        return nbytes / self.reduce_rate


def largest_power_of_two_at_most(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def ring_allreduce(nbytes: float, n: int, link: Link, at: float, flows_per_link: int = 1) -> float:
    """Pipelined ring (allreduce_ring.cc): reduce-scatter then allgather, 2(n-1) steps of n blocks.
    In each step a segment is reduced while the next arrives, so only the last segment's reduction
    of a reduce-scatter step adds to the transfer. `flows_per_link`: rings sharing each link.
    Returns the seconds from `at`."""
    if n < 2 or nbytes <= 0:
        return 0.0
    block = nbytes / n
    if link.burst == 0:  # no bucket state to carry: every step is alike
        step = link.step(block * flows_per_link, at)
        link.last = at + 2 * (n - 1) * step
        return 2 * (n - 1) * step + (n - 1) * link.reduce(min(block, SEGMENT_BYTES))
    t = at
    for i in range(2 * (n - 1)):
        t += link.step(block * flows_per_link, t)
        if i < n - 1:
            t += link.reduce(min(block, SEGMENT_BYTES))
    return t - at


def logstep_allreduce(nbytes: float, n: int, link: Link, at: float, flows_per_link: int = 1) -> float:
    """Recursive doubling (allreduce_logstep.cc): log2(p) exchanges of the whole buffer, plus a fold
    in (sent by the n - p extra ranks alone) and a copy back when n is not a power of two."""
    if n < 2 or nbytes <= 0:
        return 0.0
    p = largest_power_of_two_at_most(n)
    t = at
    if n > p:
        t += link.step_from_idle_host(nbytes * flows_per_link) + link.reduce(nbytes)
    for _ in range(int(math.log2(p))):
        t += link.step(nbytes * flows_per_link, t) + link.reduce(nbytes)
    if n > p:
        t += link.fold_step(nbytes * flows_per_link, t)
    return t - at


def halving_allreduce(nbytes: float, n: int, link: Link, at: float, flows_per_link: int = 1) -> float:
    """Halving/doubling (allreduce_halving.cc): log2(p) reduce-scatter steps moving N/2, N/4, ..,
    N/p, each reduced before the next (no pipeline across steps), then log2(p) allgather steps
    moving N/p, .., N/2; plus a fold in (sent by the n - p extra ranks alone) and a copy back of the
    whole buffer when n is not a power of two."""
    if n < 2 or nbytes <= 0:
        return 0.0
    p = largest_power_of_two_at_most(n)
    halves = [nbytes / 2 ** k for k in range(1, int(math.log2(p)) + 1)]
    t = at
    if n > p:
        t += link.step_from_idle_host(nbytes * flows_per_link) + link.reduce(nbytes)
    for part in halves:
        t += link.step(part * flows_per_link, t) + link.reduce(part)
    for part in reversed(halves):
        t += link.step(part * flows_per_link, t)
    if n > p:
        t += link.fold_step(nbytes * flows_per_link, t)
    return t - at


def allreduce(nbytes: float, n: int, link: Link, at: float, logstep_max_bytes: int, flows_per_link: int = 1,
              halving_max_bytes: int = 0) -> float:
    """allreduce.cc's choice: log-step up to logstep_max_bytes, halving/doubling up to
    halving_max_bytes, the ring above."""
    if nbytes <= logstep_max_bytes:
        return logstep_allreduce(nbytes, n, link, at, flows_per_link)
    if nbytes <= halving_max_bytes:
        return halving_allreduce(nbytes, n, link, at, flows_per_link)
    return ring_allreduce(nbytes, n, link, at, flows_per_link)


def aggregation_allreduce(nbytes: float, hosts: int, link: Link, at: float, aggregator_rate: float) -> float:
    """In-network aggregation (transport/agg): every host streams its share up to the aggregator and
    the sums stream back, chunk by chunk, both directions at once; the aggregator's link carries
    every host's share, so it bounds the rate when it is slower than all hosts' links together."""
    if hosts < 2 or nbytes <= 0:
        return 0.0
    t = at + link.step_s
    up = link.send(nbytes, t)
    up = max(up, nbytes * hosts / aggregator_rate)
    chunk = min(nbytes, SEGMENT_BYTES)
    return link.step_s * 2 + up + chunk / min(link.rate, link.cap)


def broadcast(nbytes: float, n: int, link: Link, at: float) -> float:
    """broadcast.cc: a binomial tree for small payloads, a pipelined chain for large ones."""
    if n < 2 or nbytes <= 0:
        return 0.0
    t = at
    if nbytes <= BROADCAST_TREE_MAX:
        for _ in range(math.ceil(math.log2(n))):
            t += link.step(nbytes, t)
        return t - at
    waits = max(1, n - 2)
    budget = max(BROADCAST_MIN_PIECE, BROADCAST_FIRST_PIECE // waits)
    piece = min(SEGMENT_BYTES, budget, max(BROADCAST_MIN_PIECE, nbytes / BROADCAST_CHAIN_PIECES))
    for _ in range(math.ceil(nbytes / piece) + n - 2):
        t += link.step(piece, t)
    return t - at


def ring_allgather(total_bytes: float, n: int, link: Link, at: float, flows_per_link: int = 1) -> float:
    """ring.cc's allgather: n-1 steps, each forwarding one rank's block."""
    if n < 2 or total_bytes <= 0:
        return 0.0
    t = at
    for _ in range(n - 1):
        t += link.step(total_bytes / n * flows_per_link, t)
    return t - at


def host_reduce_scatter(nbytes: float, ranks_per_host: int, lane: Link, at: float = 0.0) -> float:
    """The hierarchical allreduce's host lane (allreduce_hierarchical.cc) over shared memory: a ring
    reduce-scatter among the host's R ranks, R - 1 steps of a slice each, reduced as it arrives."""
    r = ranks_per_host
    if r < 2 or nbytes <= 0:
        return 0.0
    t = at
    for _ in range(r - 1):
        t += lane.step(nbytes / r, t) + lane.reduce(nbytes / r)
    return t - at


def host_allgather(nbytes: float, ranks_per_host: int, lane: Link, at: float = 0.0) -> float:
    r = ranks_per_host
    if r < 2 or nbytes <= 0:
        return 0.0
    t = at
    for _ in range(r - 1):
        t += lane.step(nbytes / r, t)
    return t - at
