"""A simulated job: the engine's own planner, balancer and rail health on modelled rails.

`SimJob` keeps a simulated clock. Its rail table, share balancer and rail health are the engine's
C++ objects (nezha._core.planner): the table starts cold, is calibrated with the engine's
calibration payloads, learns from every share's modelled time exactly as the rail workers feed it,
and plans every operation; a striped operation large enough to balance is re-split range by range
by the engine's balancer at simulated times; a cut rail goes down through the engine's failover
state machine and comes back through its probes. What is modelled: each share's time on its rail
(schedules.py), the negotiation's cost, and how fast a cut is noticed.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from nezha._core import planner

from . import schedules
from .cluster import Cluster, Profile

ELEM = 4  # float32: the dtype every simulated operation carries


@dataclass
class Cut:
    rail: int
    down_at: float
    up_at: float = math.inf

    def covers(self, t: float) -> bool:
        return self.down_at <= t < self.up_at


@dataclass
class OpResult:
    bytes: int
    seconds: float
    plan: str                 # the planner's one-line reason
    shares: Dict[int, int]    # bytes carried per rail (after balancing and failover)
    failed_rails: Tuple[int, ...] = ()


class SimJob:
    def __init__(self, cluster: Cluster, profile: Profile, calibrate: bool = True):
        self.cluster, self.profile = cluster, profile
        self.rails = cluster.rails
        self.table = planner.RailTable([dict(name=r.name, point_to_point=r.point_to_point) for r in self.rails])
        self.links = [self._make_link(r) for r in self.rails]
        self.health = [planner.RailHealth(r.name) for r in self.rails]
        self.cuts: List[Cut] = []
        self.now = 0.0
        self.events: List[Tuple[float, str]] = []
        if calibrate:
            self.calibrate()

    # -- the model ---------------------------------------------------------------------------
    def _make_link(self, rail) -> schedules.Link:
        p = self.profile
        rate = rail.gbps * 1e9 / 8 * p.payload_fraction.get(rail.kind, 1.0)
        burst = max(p.min_burst_bytes, rate * p.burst_s) if p.burst_s or p.min_burst_bytes else 0.0
        return schedules.Link(rate, p.step(rail.kind) * 1e-6, p.reduce_gbps * 1e9 / 8, burst,
                              p.line_gbps * 1e9 / 8)

    def link(self, rail: int, active: Sequence[int]) -> schedules.Link:
        """Rail `rail`'s link while the rails in `active` carry traffic at once. On a testbed whose
        hosts share one machine (profile.machine_gbps), the busy links share what the machine moves,
        max-min fairly: a slow link keeps its rate, the fast ones split the rest."""
        link = self.links[rail]
        busy = set(active) | {rail}
        # Every rank's worker on every busy rail does its step's work on the cores the hosts share.
        kind, ranks = self.rails[rail].kind, self.cluster.ranks
        link.step_s = self.profile.step(kind) * 1e-6
        link.cpu_s = self.profile.step_cpu_floor(kind, ranks * len(busy), ranks)
        link.wake_s = self.profile.wake_seconds(ranks)
        machine = self.profile.machine_budget_gbps([self.rails[r].gbps for r in busy], ranks)
        if machine:
            rates = sorted(self.links[r].rate for r in busy)
            budget, hosts = machine * 1e9 / 8, self.cluster.hosts
            level = float("inf")
            for i, rate in enumerate(rates):
                fair = budget / (hosts * (len(rates) - i))
                if rate > fair:
                    level = fair
                    break
                budget -= hosts * rate
            link.cap = level
        return link

    def share_seconds(self, rail: int, nbytes: float, active: Sequence[int], at: float) -> float:
        """One allreduce share of `nbytes` on `rail` from time `at`: hierarchical (host lane over
        shared memory around the hosts' rings) where hosts hold several ranks, flat otherwise."""
        c, p, r = self.cluster, self.profile, self.rails[rail]
        link = self.link(rail, active)
        if r.kind == "agg":
            agg_rate = c.hosts * r.gbps * 1e9 / 8  # the aggregator's link: as fast as all hosts' links
            return schedules.aggregation_allreduce(nbytes, c.hosts, link, at, agg_rate)
        rph = c.ranks_per_host
        if rph == 1 or not p.hierarchical:
            # A flat ring over every rank: ranks of a host are neighbours, so each host's link
            # carries one flow of the ring.
            return schedules.allreduce(nbytes, c.ranks, link, at, p.logstep_max_bytes,
                                       halving_max_bytes=p.halving_max_bytes)
        lane = self.host_lane(len(set(active) | {rail}))
        if c.hosts == 1:  # allreduce_hierarchical: one host's lane reaches every rank
            return schedules.allreduce(nbytes, rph, lane, at, p.logstep_max_bytes,
                                       halving_max_bytes=p.halving_max_bytes)
        rs = schedules.host_reduce_scatter(nbytes, rph, lane, at)
        net = schedules.allreduce(nbytes / rph, c.hosts, link, at + rs, p.logstep_max_bytes, flows_per_link=rph,
                                  halving_max_bytes=p.halving_max_bytes)
        return rs + net + schedules.host_allgather(nbytes, rph, lane, at + rs + net)

    def host_lane(self, shares: int = 1) -> schedules.Link:
        """The hosts' shared memory between their ranks while `shares` shares (one per busy rail) run
        their host lanes at once: each rank's copies and reductions share the host's memory budget
        (on a testbed whose hosts are one machine, every rank's share the machine's); its steps are
        every rank's of every share at once, on the shared cores where hosts share them."""
        c, p = self.cluster, self.profile
        sharing = c.ranks if p.machine_gbps else c.ranks_per_host
        shm = p.shm_gbps * p.background_left(c.ranks) * 1e9 / 8 / sharing / shares
        lane = schedules.Link(shm, p.step("shm") * 1e-6, min(p.reduce_gbps * 1e9 / 8, shm))
        lane.cpu_s = p.step_cpu_floor("shm", c.ranks * shares, c.ranks)
        return lane

    def negotiation_seconds(self, inline_bytes: int = 0) -> float:
        """Rank 0's path (its own cost, its work per other rank, an inline operation's bytes in and
        out) or, where the hosts share cores, every rank's negotiation CPU on what is left of them,
        whichever is longer."""
        p = self.profile
        n = self.cluster.ranks
        inline_us = p.inline_ns_per_byte * 1e-3 * 2 * (n - 1) * inline_bytes
        path = p.op_us + p.per_rank_us * (n - 1) + inline_us
        cpu = (n * p.negotiation_cpu_us + p.per_rank_us * (n - 1) + inline_us) / p.cpu_left(n)
        return max(path, cpu) * 1e-6

    # -- the engine's decisions ---------------------------------------------------------------
    def calibrate(self) -> None:
        """Engine::calibrate_rails (engine_rails.cc): each rail runs the calibration payloads alone before user traffic."""
        for rail in range(len(self.rails)):
            if not self.rails[rail].point_to_point:
                continue  # an aggregation rail has no ring to calibrate: its model learns in use
            for nbytes in planner.calibration_bytes():
                secs = self.share_seconds(rail, nbytes, (rail,), self.now)
                self.table.observe(rail, nbytes, secs)
                self.now += secs

    def cut(self, rail: int, at_s: float, restore_s: float = math.inf) -> None:
        if not 0 <= rail < len(self.rails):
            raise ValueError(f"no rail {rail} (the job has {len(self.rails)})")
        self.cuts.append(Cut(rail, at_s, restore_s))

    def _cut_during(self, rail: int, start: float, end: float) -> Optional[float]:
        hits = [max(c.down_at, start) for c in self.cuts if c.rail == rail and c.down_at < end and c.up_at > start]
        return min(hits) if hits else None

    def _probe_rails(self) -> None:
        """Before an operation: a down rail whose back-off has passed is probed (rail_health.h)."""
        for rail, h in enumerate(self.health):
            if h.state == "down" and h.probe_due(self.now):
                h.begin_probe(self.now)
                if any(c.rail == rail and c.covers(self.now) for c in self.cuts):
                    h.probe_failed(self.now)
                else:
                    h.probe_succeeded(self.now)
                    self.table.set_state(rail, "up")
                    self.events.append((self.now, f"{self.rails[rail].name} back up"))

    def _lost(self, rail: int, cut: float, failed: List[int]) -> float:
        """A share cut at `cut` is noticed at the watchdog's link tick and its rail fails over;
        returns when."""
        noticed = cut + self.profile.link_tick_ms * 1e-3
        self._fail(rail, noticed)
        failed.append(rail)
        return noticed

    def _fail(self, rail: int, at: float) -> None:
        if self.health[rail].state == "up":
            self.health[rail].mark_failed(at)
            self.table.set_state(rail, "down")
            self.events.append((at, f"{self.rails[rail].name} failed over"))

    def allreduce(self, nbytes: int) -> OpResult:
        """One allreduce of `nbytes` (float32) on every rank; advances the clock by its time."""
        n = self.cluster.ranks
        start = self.now
        self._probe_rails()
        if n >= 2 and 0 < nbytes * (n - 1) <= self.profile.inline_bytes:
            # NEZHA_CONTROL_INLINE_BYTES: rank 0 reduces it inside the negotiation.
            self.now = start + self.negotiation_seconds(nbytes)
            return OpResult(nbytes, self.now - start, "inline with negotiation", {})
        t = start + self.negotiation_seconds()
        if n < 2 or nbytes == 0:
            self.now = t
            return OpResult(nbytes, t - start, "alone", {})
        count = max(1, nbytes // ELEM)
        plan = self.table.plan(count, ELEM)
        shares = [(s.rail, s.offset, s.count) for s in plan.shares] or [(0, 0, count)]
        carried: Dict[int, int] = {}
        failed: List[int] = []
        if self._balances(shares, nbytes):
            end = self._run_balanced(plan.shares, t, carried, failed)
        else:
            end = self._run_shares(shares, t, carried, failed)
        if plan.shares:
            self.table.record_plan(plan.shares)
        # What the executor tells the table's striping check: from the shares being posted to the result.
        self.table.observe_operation(nbytes, len(plan.shares) > 1, end - t)
        self.now = end
        return OpResult(nbytes, end - start, plan.why, carried, tuple(failed))

    def _balances(self, shares, nbytes: int) -> bool:
        """Executor::balances(): two or more point-to-point shares of at least 4 minimum ranges."""
        p = self.profile
        return (p.balance_bytes > 0 and len(shares) >= 2 and self.cluster.ranks >= 2
                and nbytes >= planner.BALANCE_MIN_RANGES * p.balance_bytes
                and all(self.rails[s[0]].point_to_point for s in shares))

    def _handoff(self, parts: int) -> float:
        return self.profile.handoff_seconds(self.cluster.ranks, parts - 1)

    @staticmethod
    def _caller_part(counts: Sequence[int]) -> int:
        """The share the caller runs itself: the largest (Executor: its worker would end last)."""
        return max(range(len(counts)), key=lambda i: counts[i])

    def _run_shares(self, shares, t: float, carried: Dict[int, int], failed: List[int]) -> float:
        active = [s[0] for s in shares]
        end = t
        redo = 0
        handoff = self._handoff(len(shares))
        caller = self._caller_part([s[2] for s in shares])
        for part, (rail, _, count) in enumerate(shares):
            nbytes = count * ELEM
            late = 0.0 if part == caller else handoff
            secs = self.share_seconds(rail, nbytes, active, t + late)
            cut = self._cut_during(rail, t + late, t + late + secs)
            if cut is None:
                self.table.observe(rail, nbytes, secs)
                carried[rail] = carried.get(rail, 0) + nbytes
                end = max(end, t + secs + 2 * late)
            else:
                redo += nbytes
                end = max(end, self._lost(rail, cut, failed))
        if redo:
            end = self._redo(redo, end, carried, failed)
        return end

    def _redo(self, nbytes: int, t: float, carried: Dict[int, int], failed: List[int]) -> float:
        """Failover: the lost shares run again over the rails still up, planned afresh."""
        if not any(self.table.usable()):
            raise RuntimeError("every rail is down: the simulated job fails as the engine would")
        plan = self.table.plan(max(1, nbytes // ELEM), ELEM)
        shares = [(s.rail, s.offset, s.count) for s in plan.shares] or [(self._first_usable(), 0, nbytes // ELEM)]
        return self._run_shares(shares, t, carried, failed)

    def _first_usable(self) -> int:
        return next(i for i, u in enumerate(self.table.usable()) if u)

    def _run_balanced(self, plan_shares, t: float, carried: Dict[int, int], failed: List[int]) -> float:
        """Executor's balanced run: every rail claims its next range from the engine's balancer as
        its last one ends (the leader's clock is everyone's, within a step)."""
        p = self.profile
        # The leader's minimum range: Executor's, amortizing the largest share's rail's ring start-up.
        estimates = self.table.estimates()
        largest = max(plan_shares, key=lambda s: s.count)
        amortized = planner.amortized_range_bytes(estimates[largest.rail])
        min_claim = max(p.balance_bytes, amortized) // ELEM
        tail_claim = max(p.balance_bytes // planner.TAIL_CLAIM_SPREAD, amortized) // ELEM
        balancer = planner.ShareBalancer(plan_shares, min_claim, max(1, 4096 // ELEM),
                                         min_claim // planner.MIN_CLAIM_SPREAD, tail_claim)
        rails = [s.rail for s in plan_shares]
        handoff = self._handoff(len(rails))
        caller = self._caller_part([s.count for s in plan_shares])
        late = [0.0 if part == caller else handoff for part in range(len(rails))]
        queue = [(t + late[part], part) for part in range(len(rails))]
        heapq.heapify(queue)
        end, lost = t, 0
        while queue:
            now, part = heapq.heappop(queue)
            rail = rails[part]
            _, count = balancer.claim(part, now)
            if count == 0:
                end = max(end, now + late[part])
                continue
            nbytes = count * ELEM
            secs = p.range_us * 1e-6
            secs += self.share_seconds(rail, nbytes, rails, now + secs)
            cut = self._cut_during(rail, now, now + secs)
            if cut is not None:
                # The range in flight is lost; the rail's part stops claiming and the others take
                # what is left of its share, as they do from any share with time left.
                lost += nbytes
                end = max(end, self._lost(rail, cut, failed))
                continue
            self.table.observe(rail, nbytes, secs)
            carried[rail] = carried.get(rail, 0) + nbytes
            heapq.heappush(queue, (now + secs, part))
        if lost:
            end = self._redo(lost, end, carried, failed)
        return end
