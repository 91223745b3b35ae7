"""The benchmark matrix of issue #3: which cases, which runs per case, and their command lines.

Each run is one `nezharun ... nezha-bench` job; a run may also time Gloo in the same processes
(`--baseline gloo`), so six implementations per shaped case need only four jobs.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

FULL_SIZES = "8,1K,64K,1M,16M,64M"
QUICK_SIZES = "8,64K,1M,16M"
LATENCY_SIZES_FULL = "8,1K,64K,64M"
LATENCY_SIZES_QUICK = "8,1K,64K,16M"
RANKS = 4


@dataclass(frozen=True)
class Run:
    key: str                          # unique within its case; names the JSON and log files
    rails: str                        # nezharun --rails
    impl: str                         # nezha-bench --impl-label
    gloo_ifnames: Optional[str] = None  # also time Gloo on these interfaces

    @property
    def gloo_impl(self) -> Optional[str]:
        return "gloo-" + self.gloo_ifnames.replace(",", "+") if self.gloo_ifnames else None

    @property
    def impls(self) -> List[str]:
        return [self.impl] + ([self.gloo_impl] if self.gloo_impl else [])


@dataclass(frozen=True)
class Case:
    key: str
    title: str
    rates: Tuple[str, str]            # per rail; "off" = unshaped
    sizes: str
    runs: Tuple[Run, ...]

    @property
    def impls(self) -> List[str]:
        """nezha's variants first, then the baselines (the column order of the report)."""
        return [run.impl for run in self.runs] + [run.gloo_impl for run in self.runs if run.gloo_impl]


def shaped_runs(subnets: Sequence[str]) -> Tuple[Run, ...]:
    both = ",".join(subnets)
    return (
        Run("nezha-2rails", both, "nezha-2rails", gloo_ifnames="rail0,rail1"),
        Run("nezha-rail0", subnets[0], "nezha-rail0", gloo_ifnames="rail0"),
        Run("nezha-rail1", subnets[1], "nezha-rail1"),
        # One rail whose sockets are IPPROTO_MPTCP; the testbed's endpoints add a subflow per rail.
        Run("nezha-mptcp", f"mptcp:{subnets[0]}", "nezha-mptcp"),
    )


def build_cases(subnets: Sequence[str], quick: bool) -> List[Case]:
    if len(subnets) != 2:
        raise ValueError(f"the matrix needs exactly 2 rails, got {list(subnets)}")
    sizes = QUICK_SIZES if quick else FULL_SIZES
    return [
        Case("a", "two 1 Gbit/s rails", ("1gbit", "1gbit"), sizes, shaped_runs(subnets)),
        Case("b", "1 Gbit/s + 250 Mbit/s rails", ("1gbit", "250mbit"), sizes, shaped_runs(subnets)),
        Case("c", "unshaped rails (latency and 64 MB)", ("off", "off"),
             LATENCY_SIZES_QUICK if quick else LATENCY_SIZES_FULL,
             (Run("nezha-2rails", ",".join(subnets), "nezha-2rails", gloo_ifnames="rail0"),)),
    ]


def loopback_case(quick: bool) -> Case:
    """Issue #2's comparison: 4 ranks on this machine's loopback, no testbed, nezha vs Gloo."""
    return Case("d", "loopback, 4 ranks on one machine (CPU-bound)", ("off", "off"),
                QUICK_SIZES if quick else FULL_SIZES,
                (Run("nezha-loopback", "", "nezha-loopback", gloo_ifnames="lo"),))


def replace_flag(args: Sequence[str], flag: str, value: str) -> List[str]:
    """`args` with every `flag VALUE` / `flag=VALUE` removed and `flag value` appended."""
    out: List[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg == flag:
            skip = True
        elif not arg.startswith(flag + "="):
            out.append(arg)
    return out + [flag, value]


def run_command(run: Run, case: Case, testbed_args: Sequence[str], json_path: str, quick: bool,
                python: str = sys.executable) -> List[str]:
    """The exact argv of one run: nezharun over the testbed hosts, nezha-bench on every rank."""
    bench = [python, "-m", "nezha.bench", "--op", "allreduce", "--sizes", case.sizes, "--dtype", "float32",
             "--iters", "5" if quick else "auto", "--warmup", "1" if quick else "2",
             "--json", json_path, "--impl-label", run.impl]
    if run.gloo_ifnames:
        bench += ["--baseline", "gloo", "--gloo-ifname", run.gloo_ifnames, "--baseline-label", run.gloo_impl]
    launcher = [python, "-m", "nezha.runner", "-np", str(RANKS),
                *(replace_flag(testbed_args, "--rails", run.rails) if run.rails else testbed_args)]
    return launcher + ["--"] + bench
