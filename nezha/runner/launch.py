"""``nezharun``: start an N-rank Nezha job on this machine or on a list of hosts.

    nezharun -np N [-H host:slots,...] [--hostfile F] [--launcher 'TEMPLATE {host}']
             [--rendezvous-addr A] [--rails SPEC|auto [--dry-run]] [--aggregator HOST[@ADDR][:PORT]]
             [--start-timeout S] [--timeline FILE] [--verbose] [--] CMD ...

nezharun serves the job's rendezvous store itself, with a fresh per-job secret, and gives every
rank the NEZHA_* environment. Exit code: 0 when every rank exits 0; otherwise the first failing
rank's code (128 + N when killed by signal N), 130/143/129 when nezharun itself gets
SIGINT/SIGTERM/SIGHUP, 124 when ranks miss --start-timeout, 127 when a rank cannot be started,
2 for bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import secrets
import shlex
import sys
from typing import List, Optional, Set

from nezha.rails import resolve_rails, route_source_address
from nezha.runner.aggregator import Aggregator, parse_aggregator, rails_with_aggregator
from nezha.runner.discovery import auto_rails
from nezha.rendezvous import StoreServer
from nezha.rendezvous.keys import ARRIVED_PREFIX, rank_from_arrival_key
from nezha.runner.commands import build_rank_command
from nezha.runner.env import JobSettings, thread_defaults
from nezha.runner.hosts import (HostSlots, Placement, is_local_host, parse_host_list,
                                parse_hostfile, place_ranks)
from nezha.runner.processes import OutputSink, Supervisor
from nezha.runner.torch_store import LazyTorchStore

log = logging.getLogger("nezha.runner")


def build_parser() -> argparse.ArgumentParser:
    """The nezharun command-line parser."""
    parser = argparse.ArgumentParser(
        prog="nezharun", description="Launch a Nezha data-parallel job.",
        epilog="Example: nezharun -np 4 -H node1:2,node2:2 --rails 10.50.0.0/24,10.51.0.0/24 "
               "python train.py")
    parser.add_argument("-np", "--num-proc", dest="num_proc", type=int, required=True,
                        help="number of ranks")
    hosts = parser.add_mutually_exclusive_group()
    hosts.add_argument("-H", "--hosts", help="comma list of host:slots (default: all local)")
    hosts.add_argument("--hostfile", help="file with one 'host slots=N' (or host:N) per line")
    parser.add_argument("--launcher", help="prefix that starts a command on a host, with {host} "
                        "(e.g. 'ip netns exec {host}'); default: ssh for remote hosts")
    parser.add_argument("--rendezvous-addr", help="address the rendezvous store binds to and "
                        "ranks connect to (default: 127.0.0.1 when every host is local, else "
                        "this machine's address toward the first remote host)")
    parser.add_argument("--rails", help="rail spec: comma list of interfaces or IPv4 subnets, "
                        "each optionally 'mptcp:'-prefixed, or ofi:PROVIDER@SUBNET, or "
                        "agg:ADDR:PORT (sets NEZHA_RAILS); 'auto': the subnets every host shares, "
                        "over RDMA where every host has it (asks each host through the launcher)")
    parser.add_argument("--dry-run", action="store_true",
                        help="with --rails auto: print what each host would use and exit")
    parser.add_argument("--aggregator", metavar="HOST[@ADDR][:PORT]",
                        help="start one nezha-aggd on HOST (through --launcher or ssh) for this "
                             "job and add the rail agg:ADDR:PORT beside --rails (needs --rails)")
    parser.add_argument("--start-timeout", type=float, default=None, metavar="S",
                        help="fail if a rank has not reached the rendezvous store after S seconds")
    parser.add_argument("--timeline", metavar="FILE",
                        help="write a per-rank timeline to FILE with the rank inserted before "
                             "the extension (sets NEZHA_TIMELINE)")
    parser.add_argument("--verbose", action="store_true", help="log what nezharun does")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command each rank runs")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``nezharun``; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.dry_run and args.rails != "auto":
        parser.error("--dry-run goes with --rails auto")
    if not command and not args.dry_run:
        parser.error("no command to run")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="nezharun: %(message)s")
    try:
        placements = place_ranks(_host_slots(args), args.num_proc)
        rendezvous_addr = args.rendezvous_addr or _default_rendezvous_addr(placements)
        if args.rails == "auto":
            args.rails = auto_rails(placements, args.launcher, dry_run=args.dry_run)
            if args.dry_run:
                return 0
        if args.launcher is None and all(is_local_host(p.host) for p in placements):
            resolve_rails(args.rails, rendezvous_addr)  # catch a bad spec before starting ranks
        if args.start_timeout is not None and args.start_timeout <= 0:
            raise ValueError("--start-timeout must be positive")
        rails = args.rails
        aggregator = None
        if args.aggregator:
            if not args.rails:
                raise ValueError("--aggregator needs --rails: the TCP rails to stripe beside it")
            aggregator = parse_aggregator(args.aggregator)
            rails = rails_with_aggregator(args.rails, aggregator)
        secret = secrets.token_bytes(32)
        server = StoreServer(rendezvous_addr, 0, secret)
        torch_store = LazyTorchStore(rendezvous_addr)
    except (ValueError, OSError) as exc:
        print(f"nezharun: {exc}", file=sys.stderr)
        return 2
    daemon = (Aggregator(aggregator, args.launcher, secret.hex(), os.environ)
              if aggregator else contextlib.nullcontext())
    try:
        with server, daemon, torch_store:
            return _run(args, placements, rendezvous_addr, server, secret, rails, command,
                        torch_store)
    except RuntimeError as exc:  # the aggregator did not start
        print(f"nezharun: {exc}", file=sys.stderr)
        return 1


def _run(args, placements, rendezvous_addr, server, secret, rails, command, torch_store) -> int:
    job = JobSettings(size=len(placements), rendezvous_addr=rendezvous_addr,
                      rendezvous_port=server.port, secret_hex=secret.hex(), rails=rails,
                      timeline=os.path.abspath(args.timeline) if args.timeline else None,
                      torch_store=torch_store.environment())
    commands = [build_rank_command(p, job, command, args.launcher, os.environ, os.getcwd())
                for p in placements]
    if any(thread_defaults(p, os.environ) for p in placements):
        log.info("OMP_NUM_THREADS=1 for ranks that share a host (set OMP_NUM_THREADS to choose "
                 "another number)")
    for c in commands:
        log.info("rank %d on %s (%s): %s", c.placement.rank, c.placement.host, c.how,
                 " ".join(shlex.quote(a) for a in c.argv))
    outcome = Supervisor(commands, OutputSink()).run(
        start_timeout_s=args.start_timeout, arrived=lambda: _arrived_ranks(server))
    if outcome.reason:
        sys.stdout.flush()
        print(f"nezharun: {outcome.reason}", file=sys.stderr, flush=True)
    return outcome.exit_code


def _host_slots(args) -> List[HostSlots]:
    if args.hosts:
        return parse_host_list(args.hosts)
    if args.hostfile:
        return parse_hostfile(args.hostfile)
    return [HostSlots("localhost", max(1, args.num_proc))]


def _default_rendezvous_addr(placements: List[Placement]) -> str:
    remote = next((p.host for p in placements if not is_local_host(p.host)), None)
    if remote is None:
        return "127.0.0.1"
    try:
        return route_source_address(remote)
    except ValueError as exc:
        raise ValueError(f"cannot choose a rendezvous address reachable from host {remote} "
                         f"({exc}); pass --rendezvous-addr") from None


def _arrived_ranks(server: StoreServer) -> Set[int]:
    return {rank for key in server.keys() if key.startswith(ARRIVED_PREFIX)
            for rank in [rank_from_arrival_key(key)] if rank is not None}


if __name__ == "__main__":
    sys.exit(main())
