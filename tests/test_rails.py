"""resolve_rails(): interface names, subnets, kinds and options, defaults and clear errors, all
following the core's kind table (a kind registered at run time included); the rendezvous encoding
of opaque rail addresses."""

import ipaddress
import socket

import psutil
import pytest

from nezha import basics
from nezha.rails import RailSpec, core_rail_kinds, resolve_rails, route_source_address


def _non_loopback_ipv4():
    """(interface, address) of some non-loopback IPv4 address on this machine, if any."""
    for name, addrs in sorted(psutil.net_if_addrs().items()):
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return name, a.address, a.netmask
    return None


def test_loopback_interface_by_name():
    assert resolve_rails("lo", "127.0.0.1") == [RailSpec("lo", "127.0.0.1", "tcp")]


def test_loopback_subnet():
    assert resolve_rails("127.0.0.0/8", "127.0.0.1") == [RailSpec("127.0.0.0/8", "127.0.0.1",
                                                                  "tcp")]


def test_mptcp_prefix_and_whitespace():
    assert resolve_rails(" mptcp:lo ", "127.0.0.1") == [RailSpec("lo", "127.0.0.1", "mptcp")]
    assert resolve_rails("MPTCP:127.0.0.0/8", "127.0.0.1")[0].kind == "mptcp"


def test_several_loopback_rails_for_single_machine_multi_rail_tests():
    rails = resolve_rails("127.0.0.1/32,127.0.0.2/32,mptcp:127.0.0.3", "127.0.0.1")
    assert [(r.local_addr, r.kind) for r in rails] == [
        ("127.0.0.1", "tcp"), ("127.0.0.2", "tcp"), ("127.0.0.3", "mptcp")]
    with socket.socket() as s:  # the kernel agrees that these addresses are local
        s.bind((rails[1].local_addr, 0))


def test_unknown_interface_lists_what_exists():
    with pytest.raises(ValueError, match=r"rail nosuchnic0: no such network interface.*lo 127"):
        resolve_rails("lo,nosuchnic0", "127.0.0.1")


def test_subnet_without_a_local_address():
    with pytest.raises(ValueError,
                       match=r"rail 10\.254\.77\.0/24: no local address in that subnet; "
                             r"local addresses: .*127\.0\.0\.1"):
        resolve_rails("10.254.77.0/24", "127.0.0.1")


@pytest.mark.parametrize("spec, message", [
    ("lo,,lo", "empty item"),
    ("mptcp:", "expected"),
    ("300.1.2.0/24", "not a valid IPv4 subnet"),
])
def test_malformed_specs(spec, message):
    with pytest.raises(ValueError, match=message):
        resolve_rails(spec, "127.0.0.1")


def test_duplicate_rails_are_rejected():
    with pytest.raises(ValueError, match="'lo' and '127.0.0.0/8' both resolve to local address"):
        resolve_rails("lo,127.0.0.0/8", "127.0.0.1")
    with pytest.raises(ValueError, match="both resolve"):
        resolve_rails("lo,mptcp:lo", "127.0.0.1")


def test_default_rail_for_a_loopback_rendezvous():
    assert resolve_rails(None, "127.0.0.1") == [RailSpec("lo", "127.0.0.1", "tcp")]
    assert resolve_rails("", "localhost")[0].local_addr == "127.0.0.1"


def test_non_loopback_interface_and_its_subnet_agree():
    found = _non_loopback_ipv4()
    if found is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    name, address, netmask = found
    subnet = str(ipaddress.ip_interface(f"{address}/{netmask}").network)
    by_name = resolve_rails(name, "127.0.0.1")
    by_subnet = resolve_rails(subnet, "127.0.0.1")
    assert by_name[0].local_addr == address
    assert by_subnet == [RailSpec(subnet, address, "tcp")]
    # Routing toward another host of that subnet leaves from this address.
    peer = next(h for h in ipaddress.ip_network(subnet).hosts() if str(h) != address)
    assert route_source_address(str(peer)) == address
    assert resolve_rails(None, str(peer)) == [RailSpec(name, address, "tcp")]


def test_unresolvable_rendezvous_host():
    with pytest.raises(ValueError, match="cannot resolve"):
        route_source_address("no-such-host.invalid")


def test_kind_prefix_and_options():
    assert resolve_rails("tcp:lo", "127.0.0.1") == [RailSpec("lo", "127.0.0.1", "tcp")]
    rails = resolve_rails("tcp:127.0.0.1/32;max_share_bytes=1048576; socket_buffer_bytes=65536",
                          "127.0.0.1")
    assert rails == [RailSpec("127.0.0.1/32", "127.0.0.1", "tcp",
                              (("max_share_bytes", "1048576"), ("socket_buffer_bytes", "65536")))]


@pytest.mark.parametrize("spec, message", [
    ("carrier:lo", "unknown rail kind 'carrier'"),
    ("lo;nonsense", "is not key=value"),
    ("lo;a=1;a=2", "given twice"),
])
def test_bad_kinds_and_options(spec, message):
    with pytest.raises(ValueError, match=message):
        resolve_rails(spec, "127.0.0.1")


def test_the_core_lists_its_rail_kinds():
    kinds = core_rail_kinds()
    assert "tcp" in kinds and "mptcp" in kinds


def test_an_unknown_option_is_refused_by_the_core_naming_the_rail():
    from nezha import _core
    config = _core.EngineConfig()
    config.rails = [_core.RailConfig("lo", "127.0.0.1", "tcp", {"colour": "blue"})]
    with pytest.raises(ValueError, match="rail 'lo' \\(kind tcp\\): unknown option 'colour'"):
        _core.Engine(config)


def test_rail_addresses_travel_as_opaque_bytes():
    addresses = [b"127.0.0.1:4242", b"shm\x00\xff\x01host", b""]
    blob = basics.encode_addresses(addresses)
    assert basics.decode_addresses(blob, 3) == addresses
    assert basics.decode_addresses(basics.encode_addresses([]), 3) == []
    for malformed in (b"", b"\x01\x00", blob[:-1], blob + b"\x00", b'["127.0.0.1:4242"]',
                      b"\x01\x00\x00\x00\xff\xff\xff\xffshort"):
        with pytest.raises(ValueError, match="rank 3's rail addresses in the rendezvous store are malformed"):
            basics.decode_addresses(malformed, 3)


def test_engine_addresses_are_bytes():
    from nezha import _core
    config = _core.EngineConfig()
    config.rails = [_core.RailConfig("lo", "127.0.0.1")]
    engine = _core.Engine(config)
    addresses = engine.listen_addresses()
    assert len(addresses) == 2 and all(isinstance(a, bytes) for a in addresses)
    engine.connect_and_start([addresses])  # a job of one
    engine.shutdown()


def test_an_ofi_target_keeps_its_semicolons_and_resolves_its_address():
    if "ofi" not in core_rail_kinds():
        pytest.skip("the core in this venv predates the ofi kind")
    rails = resolve_rails("lo,ofi:tcp;ofi_rxm@127.0.0.0/8;window=4;chunk_bytes=65536", "127.0.0.1")
    assert rails[1] == RailSpec("tcp;ofi_rxm@127.0.0.0/8", "tcp;ofi_rxm@127.0.0.1", "ofi",
                                (("window", "4"), ("chunk_bytes", "65536")))
    assert resolve_rails("ofi:verbs;ofi_rxm@lo", "127.0.0.1")[0].local_addr == "verbs;ofi_rxm@127.0.0.1"
    assert resolve_rails("ofi:shm", "127.0.0.1")[0] == RailSpec("shm", "shm", "ofi")
    # Options are key=value; once they start, a bare part is malformed again; tcp never continues.
    for spec, message in [("ofi:tcp;window=4;ofi_rxm@lo", "is not key=value"),
                          ("lo;ofi_rxm", "is not key=value"),
                          ("ofi:@127.0.0.1", "expected ofi:PROVIDER@"),
                          ("ofi:tcp;ofi_rxm@10.254.77.0/24", "no local address in that subnet")]:
        with pytest.raises(ValueError, match=message):
            resolve_rails(spec, "127.0.0.1")


def test_aggregation_rail_names_its_daemon_and_binds_nothing():
    assert "agg" in core_rail_kinds()
    (tcp, agg) = resolve_rails("127.0.0.1,agg:10.51.0.5:7219;window=4", "127.0.0.1")
    assert tcp.kind == "tcp" and tcp.binds_local_address
    assert agg == RailSpec(name="10.51.0.5:7219", local_addr="10.51.0.5:7219", kind="agg",
                           options=(("window", "4"),))
    assert not agg.binds_local_address  # the engine opens its control path elsewhere


@pytest.mark.parametrize("spec", ["agg:", "agg:10.0.0.1", "agg:host:7219", "agg:10.0.0.1:0",
                                  "agg:10.0.0.1:99999"])
def test_aggregation_rail_needs_an_ipv4_address_and_port(spec):
    with pytest.raises(ValueError, match="agg:<IPv4 address>:<port>"):
        resolve_rails(spec, "127.0.0.1")


def test_nezharun_aggregator_argument():
    from nezha.runner.aggregator import parse_aggregator, rails_with_aggregator

    spec = parse_aggregator("nz-h4@10.51.0.5:7300")
    assert (spec.host, spec.addr, spec.port) == ("nz-h4", "10.51.0.5", 7300)
    assert parse_aggregator("localhost").rail == "agg:127.0.0.1:7219"
    assert rails_with_aggregator("10.50.0.0/24", spec) == "10.50.0.0/24,agg:10.51.0.5:7300"
    with pytest.raises(ValueError, match="port"):
        parse_aggregator("nz-h4@10.51.0.5:0")


def test_the_core_owns_the_kind_table():
    from nezha import _core
    table = {row["kind"]: row for row in _core.rail_kind_table()}
    assert table["tcp"]["target"] == _core.RailTarget.local_address
    assert table["shm"]["target"] == _core.RailTarget.none
    assert table["ofi"]["target"] == _core.RailTarget.provider_at_local_address
    assert table["ofi"]["target_continues_after_semicolon"]
    assert table["agg"]["target"] == _core.RailTarget.host_port
    # The control channel runs over tcp paths, and among the ranks of a host over shared memory.
    assert sorted(k for k, row in table.items() if row["control_path"]) == ["shm", "tcp"]
    items = _core.parse_rails(" lo ; window = 4 , shm")
    assert [(i.kind, i.target, i.options) for i in items] == [
        ("tcp", "lo", [("window", "4")]), ("shm", "", [])]
    with pytest.raises(ValueError, match="rail 'shm:lo': kind shm takes no target"):
        resolve_rails("shm:lo", "127.0.0.1")


def test_a_kind_the_table_does_not_ship_resolves_with_no_python_change():
    """One row registered at run time (its maker borrowed from tcp, as a transport's folder would
    bring its own): the grammar, the resolution of its target and the messages follow the row."""
    from nezha import _core
    if "lane" not in core_rail_kinds():
        _core.testing.register_rail_kind("lane", _core.RailTarget.local_address, like="tcp")
    if "lanepair" not in core_rail_kinds():
        _core.testing.register_rail_kind("lanepair", _core.RailTarget.provider_at_local_address,
                                         like="tcp", target_continues_after_semicolon=True)
    assert {"lane", "lanepair"} <= set(core_rail_kinds())
    assert resolve_rails("LANE:lo;max_share_bytes=4096", "127.0.0.1") == [
        RailSpec("lo", "127.0.0.1", "lane", (("max_share_bytes", "4096"),))]
    assert resolve_rails("lanepair:a;b@127.0.0.0/8", "127.0.0.1")[0].local_addr == "a;b@127.0.0.1"
    with pytest.raises(ValueError, match="expected lane:<interface or IPv4 subnet>"):
        resolve_rails("lane:", "127.0.0.1")
    with pytest.raises(ValueError, match="known kinds: .*lane"):
        resolve_rails("pigeon:lo", "127.0.0.1")
    with pytest.raises(ValueError, match="already registered"):
        _core.testing.register_rail_kind("lane", _core.RailTarget.none, like="tcp")


def test_a_registered_kind_carries_a_two_rank_job():
    from conftest import run_worker
    result = run_worker(2, "registered_kind.py", env={"NEZHA_AUTO_SHM": "0"}, timeout=90)
    assert result.returncode == 0, result.output
    for rank in range(2):
        assert "registered kind ok" in result.lines(rank), result.output
