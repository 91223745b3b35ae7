"""The network-namespace testbed: topology, reachability, shaping, link cuts, MPTCP, cleanup."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from nezha.testbed import Testbed, TestbedError, measure, parse_rate, testbed_available, unique_prefix
from nezha.testbed import netns
from nezha.testbed.pytest_fixtures import testbed, testbed_factory  # noqa: F401  (fixtures)

import nezha.testbed

# Child processes import nezha from wherever this process found it.
_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(nezha.testbed.__file__))))
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [_PACKAGE_PARENT, os.environ.get("PYTHONPATH")])))

needs_testbed = pytest.mark.testbed

# A listener that never accepts: the kernel completes handshakes into its backlog, which is all a
# reachability probe needs. It prints its port and lives until its stdin closes.
LISTENER = ("import socket,sys; s=socket.socket(); s.bind(('0.0.0.0',0)); s.listen(128); "
            "print(s.getsockname()[1], flush=True); sys.stdin.read()")
CONNECT = ("import socket,sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))"
           ".close()")


def leftovers(prefix: str) -> list:
    return netns.owned_namespaces(prefix) + netns.owned_links(prefix)


def can_connect(tb: Testbed, host, addr: str, port: int, timeout_s: float = 2.0) -> bool:
    done = tb.exec(host, [sys.executable, "-c", CONNECT, addr, str(port), str(timeout_s)],
                   capture_output=True, timeout=timeout_s + 10)
    return done.returncode == 0


class Listeners:
    """One LISTENER per host; port[host] is its port (each namespace has its own port space)."""

    def __init__(self, tb: Testbed):
        self.procs = [tb.popen(h, [sys.executable, "-c", LISTENER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True) for h in range(len(tb.hosts))]
        self.port = [int(p.stdout.readline()) for p in self.procs]

    def close(self) -> None:
        for proc in self.procs:
            proc.stdin.close()
            proc.wait(timeout=10)


@pytest.fixture
def listeners(testbed_factory):
    tb = testbed_factory(hosts=3, rails=2)
    ls = Listeners(tb)
    yield tb, ls
    ls.close()


# --- pure: no root needed ---------------------------------------------------------------------------

def test_names_addresses_and_nezharun_args_follow_the_scheme():
    tb = Testbed(hosts=3, rails=2, prefix="nzx")
    assert tb.hosts == ["nzx-h0", "nzx-h1", "nzx-h2"]
    assert tb.rail_subnets == ["10.50.0.0/24", "10.51.0.0/24"]
    assert tb.host_addr(0, 0) == "10.50.0.1"
    assert tb.host_addr("nzx-h2", 1) == "10.51.0.3"
    assert tb.rendezvous_addr == "10.50.0.254"
    assert tb.nezharun_args(2) == ["--launcher", "ip netns exec {host}", "-H", "nzx-h0:2,nzx-h1:2,nzx-h2:2",
                                   "--rendezvous-addr", "10.50.0.254", "--rails", "10.50.0.0/24,10.51.0.0/24"]
    with pytest.raises(ValueError, match="out of range"):
        tb.host_addr(3, 0)
    with pytest.raises(ValueError, match="out of range"):
        tb.host_addr(0, 2)
    with pytest.raises(ValueError, match="not a host"):
        tb.host_addr("other-h0", 0)


def test_aggregator_host_is_named_addressed_and_passed_to_nezharun():
    tb = Testbed(hosts=3, rails=2, prefix="nzx", aggregator=1)
    assert tb.hosts == ["nzx-h0", "nzx-h1", "nzx-h2"]  # ranks never land on the aggregator
    assert tb.aggregator_host == "nzx-h3"
    assert tb.aggregator_addr == "10.51.0.4"
    assert tb.nezharun_args()[-4:] == ["--rails", "10.50.0.0/24", "--aggregator", "nzx-h3@10.51.0.4"]
    assert Testbed(hosts=3, rails=2, prefix="nzx").aggregator_host is None
    with pytest.raises(ValueError, match="aggregator rail 2 out of range"):
        Testbed(hosts=3, rails=2, prefix="nzx", aggregator=2)


@pytest.mark.parametrize("prefix", ["", "NZ", "1nz", "nz-x", "nzabcdefghij"])
def test_bad_prefix_is_rejected(prefix):
    with pytest.raises(ValueError, match="prefix"):
        Testbed(prefix=prefix)


def test_rates_are_parsed_in_bits_and_checked_per_rail():
    assert parse_rate("1gbit") == 10**9
    assert parse_rate("250mbit") == 250 * 10**6
    assert parse_rate("1.5Gbit") == 1_500_000_000
    for bad in ("1gbps", "fast", "0mbit", "-1mbit"):
        with pytest.raises(ValueError):
            parse_rate(bad)
    with pytest.raises(ValueError, match="2 rates given for 3 rails"):
        Testbed(rails=3, rates=["1gbit", "1gbit"])


def test_availability_says_why_not_without_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    available, reason = testbed_available.__wrapped__()  # bypass the cached answer
    assert not available and "needs root" in reason


def test_unique_prefixes_differ():
    assert len({unique_prefix() for _ in range(50)}) == 50


# --- on the testbed ----------------------------------------------------------------------------------

@needs_testbed
def test_up_builds_every_host_and_rail_and_down_leaves_nothing():
    available, reason = testbed_available()
    if not available:
        pytest.skip(reason)
    tb = Testbed(hosts=3, rails=2)
    with tb:
        assert netns.owned_namespaces(tb.prefix) == tb.hosts
        assert len(netns.owned_links(tb.prefix)) == 2 + 3 * 2  # bridges + root-side veth ends
        addrs = json.loads(tb.exec(1, ["ip", "-j", "addr", "show"], capture_output=True, text=True,
                                   check=True).stdout)
        by_name = {a["ifname"]: a for a in addrs}
        assert set(by_name) == {"lo", "rail0", "rail1"}
        assert "UP" in by_name["lo"]["flags"]
        for rail in (0, 1):
            inet = [i["local"] for i in by_name[f"rail{rail}"]["addr_info"] if i["family"] == "inet"]
            assert inet == [tb.host_addr(1, rail)]
        assert tb.exec(0, ["sysctl", "-n", "net.mptcp.enabled"], capture_output=True, text=True).stdout.strip() == "1"
    assert leftovers(tb.prefix) == []
    tb.down()  # idempotent
    assert leftovers(tb.prefix) == []


@needs_testbed
def test_up_removes_leftovers_of_the_same_prefix(testbed_factory):
    prefix = unique_prefix()
    subprocess.run(["ip", "netns", "add", f"{prefix}-h7"], check=True, timeout=10)
    subprocess.run(["ip", "link", "add", f"{prefix}-br5", "type", "bridge"], check=True, timeout=10)
    tb = testbed_factory(hosts=2, rails=1, prefix=prefix)
    assert netns.owned_namespaces(prefix) == tb.hosts
    assert netns.owned_links(prefix) == [f"{prefix}-br0", f"{prefix}-h0r0", f"{prefix}-h1r0"]


def _congestion(tb, host):
    return tb.exec(host, ["sysctl", "-n", "net.ipv4.tcp_congestion_control"], capture_output=True,
                   text=True).stdout.strip()


@needs_testbed
def test_every_host_runs_the_pinned_congestion_control_whatever_the_machines_default(testbed_factory):
    machine = open("/proc/sys/net/ipv4/tcp_congestion_control").read().strip()
    tb = testbed_factory(hosts=2, rails=1)
    assert [_congestion(tb, h) for h in range(2)] == ["cubic", "cubic"]
    assert [h["congestion"] for h in tb.status()["hosts"]] == ["cubic", "cubic"]
    assert open("/proc/sys/net/ipv4/tcp_congestion_control").read().strip() == machine  # untouched
    tb.down()
    tb = testbed_factory(hosts=2, rails=1, congestion=None)
    assert [_congestion(tb, h) for h in range(2)] == [machine, machine]
    tb.down()
    with pytest.raises(TestbedError, match="'no-such-cc' is not available on this kernel"):
        testbed_factory(hosts=2, rails=1, congestion="no-such-cc")


@needs_testbed
def test_every_host_reaches_every_other_host_and_the_rendezvous_on_every_rail(listeners):
    tb, ls = listeners
    for rail in range(tb.rails):
        for src in range(3):
            for dst in range(3):
                if src != dst:
                    assert can_connect(tb, src, tb.host_addr(dst, rail), ls.port[dst]), (src, dst, rail)
    # The rendezvous store runs in the root namespace on the rail-0 bridge address.
    import socket
    with socket.socket() as store:
        store.bind((tb.rendezvous_addr, 0))
        store.listen(8)
        for host in range(3):
            assert can_connect(tb, host, tb.rendezvous_addr, store.getsockname()[1]), host


@needs_testbed
def test_rails_are_isolated_subnets(listeners):
    tb, ls = listeners
    # No route between rails: host 0 has no way to rail 1's subnet once its own rail-1 cable is cut.
    tb.set_link(1, False, host=0)
    assert not can_connect(tb, 0, tb.host_addr(1, 1), ls.port[1], timeout_s=0.5)
    assert can_connect(tb, 0, tb.host_addr(1, 0), ls.port[1])


@needs_testbed
def test_link_down_makes_the_rail_unreachable_and_up_restores_it(listeners):
    tb, ls = listeners
    tb.set_link(1, False, host=0)
    assert not tb.link_is_up(1, 0) and tb.link_is_up(1, 1) and tb.link_is_up(0, 0)
    assert not can_connect(tb, 0, tb.host_addr(1, 1), ls.port[1], timeout_s=0.5)
    assert not can_connect(tb, 1, tb.host_addr(0, 1), ls.port[0], timeout_s=0.5)
    assert can_connect(tb, 1, tb.host_addr(2, 1), ls.port[2])  # other hosts keep the rail
    assert can_connect(tb, 0, tb.host_addr(1, 0), ls.port[1])  # and host 0 keeps rail 0
    tb.set_link(1, True, host=0)
    assert tb.link_is_up(1, 0)
    assert can_connect(tb, 0, tb.host_addr(1, 1), ls.port[1])
    assert can_connect(tb, 1, tb.host_addr(0, 1), ls.port[0])
    tb.set_link(0, False)  # every host
    assert not any(tb.link_is_up(0, h) for h in range(3))
    assert not can_connect(tb, 2, tb.host_addr(1, 0), ls.port[1], timeout_s=0.5)


def assert_rate(measured_gbps: float, rate: str, tolerance: float = 0.2) -> None:
    expected = parse_rate(rate) / 1e9
    assert abs(measured_gbps - expected) <= tolerance * expected, f"{measured_gbps:.3f} Gbit/s for {rate}"


@needs_testbed
def test_shaped_rails_deliver_their_rate(testbed_factory):
    tb = testbed_factory(hosts=2, rails=2, rates=["100mbit", "250mbit"], mptcp=False)
    assert [tb.rate(r, 0) for r in (0, 1)] == ["100mbit", "250mbit"]
    for rail, rate in enumerate(["100mbit", "250mbit"]):
        transfer = measure(tb, 0, 1, tb.host_addr(1, rail), seconds=1.0, max_bytes=200 << 20)
        assert_rate(transfer.gbps, rate)


def test_aggregator_sits_on_one_rail_at_hosts_times_its_rate(testbed_factory):
    tb = testbed_factory(hosts=2, rails=2, rates=["100mbit", "100mbit"], mptcp=False, aggregator=1)
    assert tb.rate(1, tb.aggregator_host) == "200mbit"  # a switch port per host
    assert not tb.link_is_up(0, tb.aggregator_host) and tb.link_is_up(1, tb.aggregator_host)
    from nezha.runner.aggregator import daemon_binary

    daemon = tb.popen(tb.aggregator_host, [daemon_binary(), "--listen", "0.0.0.0:7219"],
                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert b"listening on" in daemon.stdout.readline()
        connect = f"import socket; socket.create_connection(({tb.aggregator_addr!r}, 7219), 3)"
        assert tb.exec(0, [sys.executable, "-c", connect]).returncode == 0  # on its rail ...
        blocked = f"import socket; socket.create_connection(('10.50.0.3', 7219), 1)"
        assert tb.exec(0, [sys.executable, "-c", blocked], stderr=subprocess.DEVNULL).returncode != 0  # ... only
    finally:
        daemon.terminate()
        daemon.wait(timeout=10)
        daemon.stdout.close()
    assert tb.status()["aggregator"] == {"host": tb.aggregator_host, "rail": 1,
                                         "address": tb.aggregator_addr}


@needs_testbed
def test_rate_change_is_applied_live(testbed_factory):
    tb = testbed_factory(hosts=2, rails=1, rates="200mbit", mptcp=False)
    assert_rate(measure(tb, 0, 1, tb.host_addr(1, 0), seconds=1.0).gbps, "200mbit")
    tb.set_rate(0, "50mbit", host=0)
    assert tb.rate(0, 0) == "50mbit" and tb.rate(0, 1) == "200mbit"
    assert_rate(measure(tb, 0, 1, tb.host_addr(1, 0), seconds=1.0).gbps, "50mbit")
    tb.set_rate(0, "off")
    assert tb.rate(0, 0) is None
    assert measure(tb, 0, 1, tb.host_addr(1, 0), seconds=0.5).gbps > 0.25  # unshaped: far above 50 Mbit/s


@needs_testbed
def test_one_mptcp_connection_uses_both_rails(testbed_factory):
    tb = testbed_factory(hosts=2, rails=2, rates="100mbit")
    tcp = measure(tb, 0, 1, tb.host_addr(1, 0), seconds=1.0)
    mptcp = measure(tb, 0, 1, tb.host_addr(1, 0), seconds=1.5, mptcp=True)
    assert_rate(tcp.gbps, "100mbit")
    # Two 100 Mbit/s rails: well above what one rail can carry.
    assert mptcp.gbps > 1.5 * 0.1, f"MPTCP {mptcp.gbps:.3f} Gbit/s vs TCP {tcp.gbps:.3f} on one rail"


@needs_testbed
def test_context_manager_cleans_up_after_an_exception():
    available, reason = testbed_available()
    if not available:
        pytest.skip(reason)
    tb = Testbed(hosts=2, rails=2)
    with pytest.raises(RuntimeError, match="boom"):
        with tb:
            assert netns.owned_namespaces(tb.prefix)
            raise RuntimeError("boom")
    assert leftovers(tb.prefix) == []


@needs_testbed
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_tears_down_then_still_kills(sig):
    available, reason = testbed_available()
    if not available:
        pytest.skip(reason)
    prefix = unique_prefix()
    script = ("import sys, time\nfrom nezha.testbed import Testbed\n"
              f"tb = Testbed(hosts=2, rails=2, prefix={prefix!r}).up()\n"
              "print('UP', flush=True)\ntime.sleep(30)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=ENV)
    try:
        assert proc.stdout.readline().strip() == "UP", proc.stderr.read()
        assert netns.owned_namespaces(prefix)
        proc.send_signal(sig)
        proc.wait(timeout=20)
        assert proc.returncode == -sig  # the signal was re-raised after the teardown
        assert leftovers(prefix) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        netns.destroy(prefix)


@needs_testbed
def test_down_kills_processes_left_in_the_hosts(testbed):
    proc = testbed.popen(0, ["sleep", "60"])
    testbed.down()
    assert proc.wait(timeout=10) == -signal.SIGTERM
    with pytest.raises(TestbedError, match="not up"):
        testbed.exec(0, ["true"])


def cli(*args, check=True) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "nezha.testbed", *args], capture_output=True, text=True,
                          env=ENV, timeout=60)
    if check:
        assert done.returncode == 0, done.stderr
    return done


@needs_testbed
def test_cli_up_status_rate_link_args_down():
    available, reason = testbed_available()
    if not available:
        pytest.skip(reason)
    prefix = unique_prefix()
    try:
        up = json.loads(cli("up", "--prefix", prefix, "--hosts", "2", "--rails", "2", "--rate", "1gbit,250mbit").stdout)
        assert [r["rate"] for r in up["hosts"][1]["rails"]] == ["1gbit", "250mbit"]
        cli("rate", "--prefix", prefix, "--rail", "1", "--host", "1", "off")
        cli("link", "--prefix", prefix, "--rail", "0", "--host", f"{prefix}-h0", "down")
        status = json.loads(cli("status", "--prefix", prefix).stdout)
        assert status["rendezvous_addr"] == "10.50.0.254"
        assert [r["subnet"] for r in status["rails"]] == ["10.50.0.0/24", "10.51.0.0/24"]
        assert [(r["address"], r["rate"], r["link"]) for h in status["hosts"] for r in h["rails"]] == [
            ("10.50.0.1", "1gbit", "down"), ("10.51.0.1", "250mbit", "up"),
            ("10.50.0.2", "1gbit", "up"), ("10.51.0.2", None, "up")]
        args = cli("nezharun-args", "--prefix", prefix, "--slots", "2").stdout.strip()
        assert args == (f"--launcher 'ip netns exec {{host}}' -H {prefix}-h0:2,{prefix}-h1:2 "
                        "--rendezvous-addr 10.50.0.254 --rails 10.50.0.0/24,10.51.0.0/24")
        bad = cli("rate", "--prefix", prefix, "--rail", "2", "1gbit", check=False)
        assert bad.returncode == 1 and "rail 2 out of range" in bad.stderr
        cli("down", "--prefix", prefix)
        assert leftovers(prefix) == []
        cli("down", "--prefix", prefix)  # idempotent
        missing = cli("status", "--prefix", prefix, check=False)
        assert missing.returncode == 1 and "no testbed" in missing.stderr
    finally:
        netns.destroy(prefix)


@needs_testbed
def test_a_second_testbed_waits_for_the_first_then_gives_up_clearly():
    available, reason = testbed_available()
    if not available:
        pytest.skip(reason)
    from nezha.testbed.exclusive import MachineLock
    other = MachineLock()
    other.acquire(timeout_s=30, holder="nzother")
    try:
        tb = Testbed(hosts=1, rails=1, wait_for_other_s=0.3)
        with pytest.raises(TestbedError, match=r"another testbed \(prefix nzother"):
            tb.up()
        assert leftovers(tb.prefix) == []
    finally:
        other.release()


@needs_testbed
def test_a_testbed_left_up_by_the_cli_is_reported_not_clobbered():
    available, reason = testbed_available()
    if not available:
        pytest.skip(reason)
    cli_prefix = unique_prefix()
    try:
        cli("up", "--prefix", cli_prefix, "--hosts", "1", "--rails", "1")
        tb = Testbed(hosts=1, rails=1)
        with pytest.raises(TestbedError, match=f"{cli_prefix}-br0 already holds 10.50.0.254"):
            tb.up()
        assert leftovers(tb.prefix) == []
        assert netns.owned_namespaces(cli_prefix) == [f"{cli_prefix}-h0"]
    finally:
        netns.destroy(cli_prefix)
