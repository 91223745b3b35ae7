"""`nezha-bench`: run under nezharun, one process per rank; rank 0 prints the table and writes JSON.

    nezharun -np 4 nezha-bench --op allreduce --sizes 8,1K,64K,1M,64M --iters auto --baseline gloo
"""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from nezha.bench.metrics import OPS
from nezha.bench.records import BenchRecord, write_json
from nezha.bench.report import format_table, format_title
from nezha.bench.sizes import parse_sizes
from nezha.bench.timing import IterationPolicy, parse_iters
from nezha.bench.workloads import DTYPES, VerificationError, numpy_dtype

DEFAULT_SIZES = "8,1K,64K,1M,64M"
DEFAULT_BASELINE_TIMEOUT_S = 300.0


def _argtype(parse, what: str):
    """Wraps a parser so argparse reports its ValueError message as a usage error."""
    def convert(text: str):
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    convert.__name__ = what
    return convert


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nezha-bench",
        description="Collective benchmark in the nccl-tests style (run under nezharun, one process per rank).")
    parser.add_argument("--op", choices=OPS, default="allreduce", help="collective to time (default allreduce)")
    parser.add_argument("--sizes", type=_argtype(parse_sizes, "sizes"), default=parse_sizes(DEFAULT_SIZES),
                        help=f"bytes per rank, comma list, K/M/G = powers of 1024 (default {DEFAULT_SIZES})")
    parser.add_argument("--dtype", choices=DTYPES, default="float32", help="element type (default float32)")
    parser.add_argument("--iters", type=_argtype(parse_iters, "iters"), default=None, metavar="N|auto",
                        help="timed iterations per size; auto (default): about 1 s, 5 to 200 iterations")
    parser.add_argument("--warmup", type=int, default=2, metavar="N",
                        help="untimed iterations per size after the checked one (default 2)")
    parser.add_argument("--json", metavar="FILE", help="rank 0 writes the records here")
    parser.add_argument("--baseline", choices=("gloo",),
                        help="also time torch.distributed/Gloo on the same ranks and print the ratio")
    parser.add_argument("--gloo-ifname", metavar="IF[,IF]",
                        help="GLOO_SOCKET_IFNAME for the baseline (default: the interface of nezha's first rail)")
    parser.add_argument("--impl-label", default="nezha", metavar="NAME",
                        help="the JSON 'impl' of nezha's records, e.g. nezha-2rails (default nezha)")
    parser.add_argument("--baseline-label", metavar="NAME",
                        help="the JSON 'impl' of the baseline's records (default gloo-<ifnames>)")
    parser.add_argument("--timeout-s", type=float, default=None, metavar="S",
                        help="timeout for init and for each collective (default: NEZHA_TIMEOUT_S)")
    return parser


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    if args.gloo_ifname and not args.baseline:
        parser.error("--gloo-ifname needs --baseline gloo")
    if args.baseline and baseline_label(args) == args.impl_label:
        parser.error(f"--impl-label and the baseline's label are both {args.impl_label!r}")
    try:
        numpy_dtype(args.dtype)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def baseline_label(args: argparse.Namespace) -> str:
    if args.baseline_label:
        return args.baseline_label
    if args.gloo_ifname:
        return "gloo-" + "+".join(name.strip() for name in args.gloo_ifname.split(",") if name.strip())
    return "gloo"


def run(args: argparse.Namespace) -> List[BenchRecord]:
    """Runs the benchmark on this rank; returns nezha's records followed by the baseline's."""
    import nezha
    from nezha.bench.measure import measure
    from nezha.bench.nezha_backend import NezhaBackend, NezhaCoordinator
    from nezha.bench.progress import ProgressReporter

    nezha.init(timeout_s=args.timeout_s)
    baseline = None
    try:
        coord = NezhaCoordinator(nezha, args.timeout_s)
        backends = [NezhaBackend(nezha, args.impl_label)]
        if args.baseline == "gloo":
            from nezha.bench.gloo_baseline import GlooBaseline
            baseline = GlooBaseline(nezha, baseline_label(args), args.gloo_ifname,
                                    args.timeout_s or DEFAULT_BASELINE_TIMEOUT_S)
            backends.append(baseline)
        policy = IterationPolicy(iters=args.iters, warmup=args.warmup)
        results = {backend.impl: [] for backend in backends}
        with ProgressReporter(total=len(args.sizes) * len(backends), enabled=coord.rank == 0) as progress:
            # Sizes outermost so nezha and the baseline see the same network conditions per size.
            for num_bytes in args.sizes:
                for backend in backends:
                    progress.starting(backend.impl, args.op, num_bytes)
                    record = measure(backend, coord, args.op, num_bytes, args.dtype, policy)
                    results[backend.impl].append(record)
                    progress.finished(record)
        ours = results[args.impl_label]
        theirs = results[baseline.impl] if baseline else None
        if coord.rank == 0:
            iters_text = "auto" if args.iters is None else str(args.iters)
            print(format_title(args.op, args.impl_label, coord.world, args.dtype, iters_text))
            print(format_table(ours, theirs), flush=True)
            if args.json:
                write_json(args.json, ours + (theirs or []))
        return ours + (theirs or [])
    finally:
        if baseline is not None:
            baseline.close()
        nezha.shutdown()


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    try:
        run(args)
    except VerificationError as exc:
        print(f"nezha-bench: wrong result: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except (RuntimeError, OSError) as exc:  # NezhaError, Gloo's errors, writing the JSON; bugs keep
        print(f"nezha-bench: {type(exc).__name__}: {exc}", file=sys.stderr)  # their traceback
        return 1
    return 0
