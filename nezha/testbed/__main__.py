"""`python -m nezha.testbed up|down|rate|link|status|nezharun-args`: the testbed from a shell."""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from .commands import TestbedError
from .testbed import Testbed
from . import congestion as tcp_congestion
from . import netns

DEFAULT_PREFIX = "nz"


def _host(value: str):
    return int(value) if value.isdigit() else value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m nezha.testbed",
        description="Hosts as network namespaces <prefix>-h<i>, rails as bridges <prefix>-br<r> "
                    "(rail r = 10.(50+r).0.0/24). Needs root.")
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name, help_text):
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--prefix", default=DEFAULT_PREFIX, help=f"name prefix (default {DEFAULT_PREFIX})")
        return p

    up = command("up", "build the testbed (removing leftovers with the same prefix first)")
    up.add_argument("--hosts", type=int, required=True)
    up.add_argument("--rails", type=int, required=True)
    up.add_argument("--rate", default=None,
                    help="egress shaping per rail, e.g. 1gbit or 1gbit,250mbit (one value: every rail; off: none)")
    up.add_argument("--no-mptcp", action="store_true", help="leave MPTCP endpoints unconfigured")
    up.add_argument("--congestion", default=tcp_congestion.DEFAULT, metavar="ALGORITHM",
                    help=f"every host's TCP congestion control (default {tcp_congestion.DEFAULT}; "
                         "'machine': the machine's own default)")
    up.add_argument("--aggregator", type=int, nargs="?", const=0, default=None, metavar="RAIL",
                    help="add an aggregator host (the last namespace) on RAIL's bridge (default 0), "
                         "its link shaped at hosts x the rail's rate, for nezha-aggd")

    command("down", "remove everything with this prefix (idempotent)")

    rate = command("rate", "change a rail's shaping live")
    rate.add_argument("--rail", type=int, required=True)
    rate.add_argument("--host", type=_host, default=None, help="index or namespace name (default: every host)")
    rate.add_argument("rate", help="e.g. 500mbit, or off")

    link = command("link", "cut or restore a rail (the bridge side of the host's veth)")
    link.add_argument("--rail", type=int, required=True)
    link.add_argument("--host", type=_host, default=None, help="index or namespace name (default: every host)")
    link.add_argument("state", choices=["up", "down"])

    status = command("status", "print hosts, rails, addresses, rates and link states as JSON")

    args = command("nezharun-args", "print the nezharun flags that run a job on this testbed")
    args.add_argument("--slots", type=int, default=1, help="ranks per host (default 1)")
    for p in (status, args):
        p.add_argument("--aggregator", type=int, default=None, metavar="RAIL",
                       help="the testbed was built with --aggregator RAIL (its last host is the "
                            "aggregator; nezharun-args then adds --aggregator)")
    return parser


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "up":
            rates = None if args.rate is None else args.rate.split(",")
            if rates is not None and len(rates) == 1:
                rates = rates[0]
            testbed = Testbed(args.hosts, args.rails, rates=rates, prefix=args.prefix,
                              mptcp=not args.no_mptcp, persistent=True, aggregator=args.aggregator,
                              congestion=None if args.congestion == "machine" else args.congestion).up()
            print(json.dumps(testbed.status(), indent=2))
        elif args.command == "down":
            netns.destroy(args.prefix)
        else:
            testbed = Testbed.attach(args.prefix, getattr(args, "aggregator", None))
            if args.command == "rate":
                testbed.set_rate(args.rail, args.rate, host=args.host)
            elif args.command == "link":
                testbed.set_link(args.rail, args.state == "up", host=args.host)
            elif args.command == "status":
                print(json.dumps(testbed.status(), indent=2))
            elif args.command == "nezharun-args":
                print(shlex.join(testbed.nezharun_args(args.slots)))
    except (TestbedError, ValueError) as exc:
        print(f"nezha.testbed {args.command}: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
