"""The `Testbed`: N hosts x R rails of network namespaces, as a context manager."""

from __future__ import annotations

import secrets
import subprocess
from typing import Optional, Sequence, Union

from . import commands, exclusive, lifecycle, mptcp, netns, shaping, topology
from . import congestion as tcp_congestion
from .topology import Topology

Host = Union[int, str]
# exec() and popen() callers may pass their own; a hung command must not hang a test run.
DEFAULT_EXEC_TIMEOUT_S = 120.0


def unique_prefix() -> str:
    """A fresh prefix ('nz' + 6 hex digits), so one run never mistakes another's namespaces for its own."""
    return "nz" + secrets.token_hex(3)


class Testbed:
    """Hosts are namespaces `<prefix>-h<i>`, rail r is bridge `<prefix>-br<r>` on 10.(50+r).0.0/24.

    `with Testbed(hosts=4, rails=2, rates=["1gbit", "1gbit"]) as tb:` builds it (removing leftovers
    of the same prefix first) and removes it on exit, also on exceptions, SIGINT and SIGTERM.
    `persistent=True` (the CLI's `up`) leaves it in place when this process exits.
    `aggregator=r` adds one more namespace, the aggregator host (`aggregator_host`, for nezha-aggd),
    on rail r's bridge only (its links to the other rails are cut), with its egress shaped at
    hosts x rail r's rate: a switch's ports are each as fast as a host's, so the aggregator can send
    every host its result at full speed at once.
    Every host's TCP runs `congestion` (congestion.py: CUBIC unless asked otherwise; None keeps the
    machine's default, which differs between machines).
    Only one testbed can be up per machine (they share the root namespace's 10.5x.0.254 addresses):
    `up()` waits for another process's testbed to be torn down, and refuses if one left by the CLI is up.
    """

    __test__ = False  # not a pytest test class despite the name

    def __init__(self, hosts: int = 2, rails: int = 2, rates: Union[None, str, Sequence[Optional[str]]] = None,
                 prefix: Optional[str] = None, mptcp: bool = True, persistent: bool = False,
                 wait_for_other_s: float = 120.0, aggregator: Optional[int] = None,
                 congestion: Optional[str] = tcp_congestion.DEFAULT):
        self._rank_hosts = hosts
        self._congestion = congestion
        self._aggregator = aggregator
        if aggregator is not None and not 0 <= aggregator < rails:
            raise ValueError(f"aggregator rail {aggregator} out of range: {rails} rails")
        self._topo = Topology(unique_prefix() if prefix is None else prefix,
                              hosts + (1 if aggregator is not None else 0), rails)
        self._rates = self._per_rail_rates(rates)
        self._mptcp = mptcp
        self._persistent = persistent
        self._wait_for_other_s = wait_for_other_s
        self._machine_lock = exclusive.MachineLock()
        self._is_up = False

    @classmethod
    def attach(cls, prefix: str, aggregator: Optional[int] = None) -> "Testbed":
        """The testbed already running under prefix (built by `python -m nezha.testbed up`);
        `aggregator`: the rail it was built with `--aggregator` on (its last namespace is then the
        aggregator host, not a rank host)."""
        topo = netns.discover(prefix)
        if topo is None:
            raise commands.TestbedError(f"no testbed with prefix {prefix!r} is up")
        hosts = topo.hosts - (1 if aggregator is not None else 0)
        testbed = cls(hosts, topo.rails, prefix=prefix, persistent=True, aggregator=aggregator)
        testbed._is_up = True
        return testbed

    # --- lifecycle -------------------------------------------------------------------------------

    def up(self) -> "Testbed":
        """Builds the testbed; first waits (up to wait_for_other_s) for another process's testbed to go."""
        if self._is_up:
            raise commands.TestbedError(f"testbed {self.prefix!r} is already up")
        netns.destroy(self.prefix)
        self._machine_lock.acquire(self._wait_for_other_s, self.prefix)
        if not self._persistent:
            lifecycle.register(self)
        self._is_up = True
        try:
            exclusive.check_no_other_testbed(self.prefix)
            netns.create(self._topo)
            if self._congestion:
                tcp_congestion.allow(self._congestion)
                for namespace in self._topo.host_names:
                    tcp_congestion.configure(namespace, self._congestion)
            for host, namespace in enumerate(self.hosts):
                if self._mptcp:
                    mptcp.configure(namespace, host, self.rails)
                for rail, rate in enumerate(self._rates):
                    if rate is not None:
                        shaping.set_rate(namespace, topology.host_interface(rail), rate)
            if self._aggregator is not None:
                self._place_aggregator()
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        """Removes every namespace, bridge and veth of this prefix. Idempotent."""
        try:
            netns.destroy(self.prefix)
        finally:
            self._is_up = False
            self._machine_lock.release()
            lifecycle.unregister(self)

    def __enter__(self) -> "Testbed":
        return self.up()

    def __exit__(self, *exc_info) -> None:
        self.down()

    # --- description ---------------------------------------------------------------------------

    @property
    def prefix(self) -> str:
        return self._topo.prefix

    @property
    def rails(self) -> int:
        return self._topo.rails

    @property
    def hosts(self) -> list:
        """Namespace names, which are also the host names nezharun's launcher substitutes (the
        aggregator host is not one of them)."""
        return self._topo.host_names[:self._rank_hosts]

    @property
    def aggregator_host(self) -> Optional[str]:
        """The aggregator's namespace, or None without one."""
        return None if self._aggregator is None else self._topo.host_names[-1]

    @property
    def aggregator_addr(self) -> Optional[str]:
        """The aggregator's address on its rail, or None without one."""
        if self._aggregator is None:
            return None
        return str(topology.host_address(self._rank_hosts, self._aggregator))

    def _place_aggregator(self) -> None:
        index = self._rank_hosts
        for rail in range(self.rails):
            if rail != self._aggregator:
                netns.set_port(self.prefix, index, rail, False)
        rate = self._rates[self._aggregator]
        interface = topology.host_interface(self._aggregator)
        if rate is not None:
            shaping.set_rate(self._topo.host_names[index], interface,
                             shaping.format_rate(shaping.parse_rate(rate) * self._rank_hosts))

    @property
    def rail_subnets(self) -> list:
        return [str(s) for s in self._topo.rail_subnets]

    @property
    def rendezvous_addr(self) -> str:
        """The rail-0 bridge's address in the root namespace: reachable from every host."""
        return str(topology.bridge_address(0))

    def host_addr(self, host: Host, rail: int) -> str:
        return str(topology.host_address(self._topo.host_index(host), self._topo.check_rail(rail)))

    def bridge_addr(self, rail: int) -> str:
        return str(topology.bridge_address(self._topo.check_rail(rail)))

    def interface(self, rail: int) -> str:
        """The rail's interface name inside every host namespace."""
        return topology.host_interface(self._topo.check_rail(rail))

    def nezharun_args(self, slots_per_host: int = 1, start_aggregator: bool = True) -> list:
        """Flags that run a job on this testbed; with an aggregator host (and start_aggregator),
        nezharun starts nezha-aggd there and stripes beside it (`--aggregator`)."""
        if slots_per_host < 1:
            raise ValueError(f"slots_per_host must be at least 1, got {slots_per_host}")
        args = ["--launcher", "ip netns exec {host}",
                "-H", ",".join(f"{h}:{slots_per_host}" for h in self.hosts),
                "--rendezvous-addr", self.rendezvous_addr,
                "--rails", ",".join(self.rail_subnets)]
        if self._aggregator is not None and start_aggregator:
            # TCP on the other rails, nezha-aggd (started by nezharun) on the aggregator's rail.
            others = [s for r, s in enumerate(self.rail_subnets) if r != self._aggregator]
            args[-1] = ",".join(others) or self.rail_subnets[self._aggregator]
            args += ["--aggregator", f"{self.aggregator_host}@{self.aggregator_addr}"]
        return args

    def status(self) -> dict:
        """Hosts, rails, addresses, shaping and link states, read back from the system."""
        self._require_up()
        hosts = []
        for host, namespace in enumerate(self._topo.host_names):
            hosts.append({"name": namespace, "congestion": tcp_congestion.current(namespace), "rails": [
                {"rail": rail, "interface": self.interface(rail), "address": self.host_addr(host, rail),
                 "rate": self.rate(rail, host), "link": "up" if self.link_is_up(rail, host) else "down"}
                for rail in range(self.rails)]})
        rails = [{"rail": rail, "subnet": self.rail_subnets[rail],
                  "bridge": topology.bridge_name(self.prefix, rail), "bridge_addr": self.bridge_addr(rail)}
                 for rail in range(self.rails)]
        out = {"prefix": self.prefix, "rendezvous_addr": self.rendezvous_addr, "rails": rails, "hosts": hosts}
        if self._aggregator is not None:
            out["aggregator"] = {"host": self.aggregator_host, "rail": self._aggregator,
                                 "address": self.aggregator_addr}
        return out

    # --- live changes ----------------------------------------------------------------------------

    def set_rate(self, rail: int, rate: Optional[str], host: Optional[Host] = None) -> None:
        """Shapes rail's egress on host (every host if None) to rate; None or 'off' removes shaping."""
        self._require_up()
        if rate is not None and str(rate).strip().lower() != "off":
            shaping.parse_rate(rate)  # reject a bad rate before touching any host
        interface = self.interface(rail)
        for index in self._host_indices(host):
            shaping.set_rate(self._topo.host_names[index], interface, rate)

    def rate(self, rail: int, host: Host) -> Optional[str]:
        """The shaping currently applied to host's rail, e.g. '1gbit', or None when unshaped."""
        return shaping.current_rate(self._topo.host_names[self._topo.host_index(host)], self.interface(rail))

    def set_link(self, rail: int, up: bool, host: Optional[Host] = None) -> None:
        """Cuts (up=False) or restores host's link to rail (every host if None), like pulling a cable."""
        self._require_up()
        self._topo.check_rail(rail)
        for index in self._host_indices(host):
            netns.set_port(self.prefix, index, rail, up)
        if up:
            netns.forget_failed_neighbors(self._topo, rail)

    def link_is_up(self, rail: int, host: Host) -> bool:
        return netns.port_is_up(self.prefix, self._topo.host_index(host), self._topo.check_rail(rail))

    # --- running things on hosts ---------------------------------------------------------------

    def exec(self, host: Host, argv: Sequence[str], **subprocess_kwargs) -> subprocess.CompletedProcess:
        """subprocess.run(argv) inside host's namespace (default timeout 120 s, no check)."""
        subprocess_kwargs.setdefault("timeout", DEFAULT_EXEC_TIMEOUT_S)
        return subprocess.run(self._in_host(host, argv), **subprocess_kwargs)

    def popen(self, host: Host, argv: Sequence[str], **subprocess_kwargs) -> subprocess.Popen:
        """subprocess.Popen(argv) inside host's namespace; `down()` kills it if it is still running."""
        return subprocess.Popen(self._in_host(host, argv), **subprocess_kwargs)

    # --- helpers -------------------------------------------------------------------------------

    def _in_host(self, host: Host, argv: Sequence[str]) -> list:
        self._require_up()
        if isinstance(argv, (str, bytes)):
            raise TypeError("argv must be a list of arguments, not a string")
        return commands.in_netns(self._topo.host_names[self._topo.host_index(host)], argv)

    def _host_indices(self, host: Optional[Host]) -> list:
        return list(range(self._rank_hosts)) if host is None else [self._topo.host_index(host)]

    def _per_rail_rates(self, rates) -> list:
        if rates is None or isinstance(rates, str):
            rates = [rates] * self._topo.rails
        rates = [None if r is None or str(r).strip().lower() == "off" else r for r in rates]
        if len(rates) != self._topo.rails:
            raise ValueError(f"{len(rates)} rates given for {self._topo.rails} rails")
        for rate in rates:
            if rate is not None:
                shaping.parse_rate(rate)
        return rates

    def _require_up(self) -> None:
        if not self._is_up:
            raise commands.TestbedError(f"testbed {self.prefix!r} is not up")

    def __repr__(self) -> str:
        state = "up" if self._is_up else "down"
        return f"Testbed(prefix={self.prefix!r}, hosts={self._topo.hosts}, rails={self.rails}, {state})"
