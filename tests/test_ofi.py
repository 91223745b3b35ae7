"""The ofi rail (libfabric) from Python: the kind is known, a provider that does not exist is a
clear error, and on the testbed a TCP rail striped with an ofi rail over libfabric's tcp provider
survives a cut of the ofi rail's link with exact results. Rail discovery (--rails auto)."""
import os
import subprocess
import sys

import pytest

from conftest import REPO
from nezha.testbed.pytest_fixtures import testbed_factory  # noqa: F401 (fixture)
from nezha.rail_discovery import HostInventory, choose_rails

_core = pytest.importorskip("nezha._core")
needs_ofi = pytest.mark.skipif(not getattr(_core, "ofi_available", lambda: False)(),
                               reason="this nezha._core was built without libfabric")


def test_the_ofi_kind_is_always_known():
    assert "ofi" in _core.rail_kinds()


@needs_ofi
def test_a_provider_that_does_not_exist_is_a_clear_error():
    config = _core.EngineConfig()
    config.rails = [_core.RailConfig("no-such-provider@127.0.0.1", "no-such-provider@127.0.0.1", "ofi")]
    with pytest.raises(Exception, match="no usable provider 'no-such-provider'.*RDM providers here: .*tcp"):
        _core.Engine(config)


def test_nezha_imports_where_libfabric_cannot_be_loaded_and_an_ofi_rail_says_why(tmp_path):
    # A "libfabric.so.1" that is not a library, first on the search path: a _core linked against
    # libfabric would fail to import; ours loads it only when an ofi rail is asked for.
    (tmp_path / "libfabric.so.1").write_bytes(b"not an ELF file")
    script = (
        "import nezha, nezha._core as c\n"
        "assert not c.ofi_available() and c.ofi_providers() == []\n"
        "config = c.EngineConfig()\n"
        "config.rails = [c.RailConfig('r', 'tcp;ofi_rxm@127.0.0.1', 'ofi')]\n"
        "try:\n"
        "    c.Engine(config)\n"
        "except nezha.NezhaError as e:\n"
        "    print('refused:', e)\n")
    env = dict(__import__("os").environ, LD_LIBRARY_PATH=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert "refused: rail 'r' (kind ofi): libfabric cannot be loaded" in out.stdout, out.stdout
    assert "libfabric1" in out.stdout


@needs_ofi
def test_libfabric_lists_its_tcp_provider():
    assert any(p.startswith("tcp") for p in _core.ofi_providers()), _core.ofi_providers()


def _inventory(host, nets, rdma=(), providers=("tcp;ofi_rxm",)):
    interfaces = [(f"eth{i}", net.replace("0/24", str(10 + int(host[-1]))), net)
                  for i, net in enumerate(nets)]
    return HostInventory(host, interfaces, list(providers),
                         [(f"mlx5_{i}", [f"eth{i}"]) for i in rdma])


def test_auto_rails_are_the_shared_subnets_over_rdma_where_every_host_has_it():
    nets = ["10.50.0.0/24", "10.60.0.0/24", "192.168.1.0/24"]
    both = ("tcp;ofi_rxm", "verbs;ofi_rxm")
    hosts = [_inventory("h1", nets, rdma=[1], providers=both),
             _inventory("h2", nets[:2], rdma=[1], providers=both)]
    spec, lines = choose_rails(hosts)
    assert spec == "10.50.0.0/24,ofi:verbs;ofi_rxm@10.60.0.0/24"  # 192.168.1.0/24: h1 only
    assert "h2: ofi:verbs;ofi_rxm@10.60.0.0/24: eth1 10.60.0.12 (RDMA mlx5_1 via libfabric verbs;ofi_rxm)" in lines
    # One host without the RDMA device (or without libfabric's verbs): TCP on that subnet.
    spec, _ = choose_rails([hosts[0], _inventory("h2", nets[:2], providers=both)])
    assert spec == "10.50.0.0/24,10.60.0.0/24"
    spec, _ = choose_rails([hosts[0], _inventory("h2", nets[:2], rdma=[1])])
    assert spec == "10.50.0.0/24,10.60.0.0/24"
    # Nothing shared (loopback never counts): the default rail.
    assert choose_rails([_inventory("h1", ["10.50.0.0/24"]), _inventory("h2", ["10.60.0.0/24"])])[0] is None


def test_discover_lists_this_hosts_interfaces_and_providers():
    from nezha.rails import discover
    inv = discover()
    assert ("lo", "127.0.0.1", "127.0.0.0/8") in inv.interfaces
    assert inv.ofi_providers == list(_core.ofi_providers())


def test_an_inventory_survives_its_trip_through_json():
    inv = _inventory("h1", ["10.50.0.0/24"], rdma=[0])
    assert HostInventory.from_json("h1", inv.to_json()) == inv
    with pytest.raises(ValueError, match="host h9: unreadable rail inventory"):
        HostInventory.from_json("h9", "not json")


def test_dry_run_prints_this_hosts_view_and_exits():
    out = subprocess.run([sys.executable, "-m", "nezha.runner.launch", "-np", "2", "--rails", "auto",
                          "--dry-run"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "lo 127.0.0.1 (127.0.0.0/8)" in out.stdout and "libfabric providers" in out.stdout, out.stdout
    assert out.stdout.splitlines()[-1].startswith(("--rails ", "no subnet")), out.stdout


@pytest.mark.testbed
def test_dry_run_on_the_testbed_finds_both_rails_on_every_host(testbed_factory):
    tb = testbed_factory(hosts=3, rails=2, rates=["1gbit", "1gbit"])
    args = tb.nezharun_args()
    args[args.index("--rails") + 1] = "auto"
    out = subprocess.run([sys.executable, "-m", "nezha.runner.launch", "-np", "3", *args, "--dry-run"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"--rails {','.join(tb.rail_subnets)}" in out.stdout, out.stdout
    for host in tb.hosts:
        assert sum(l.startswith(f"would use {host}: ") for l in out.stdout.splitlines()) == 2, out.stdout


def _log(r: dict, chars: int = 4000) -> str:
    """The ranks' log lines of a drill (its DRILL records, long lists of times, left out): what a
    failing assertion shows, the rail's failures and its re-admission probes' reasons included."""
    return "\n".join(l for l in r["output"].splitlines() if "DRILL " not in l)[-chars:]


@needs_ofi
def test_ofi_rxm_uses_the_write_rendezvous_before_libfabric_1_18_unless_the_user_chose(tmp_path):
    """libfabric 1.17's tcp provider frees a stalled RMA read twice when its connection closes; the
    rail steers ofi_rxm to the write rendezvous (no reads) there, and a user's own setting wins."""
    script = (
        "import ctypes, nezha._core as c\n"
        "c.ofi_providers()\n"
        "fabric = ctypes.CDLL('libfabric.so.1')\n"
        "libc = ctypes.CDLL(None)\n"
        "libc.getenv.restype = ctypes.c_char_p\n"
        "print(fabric.fi_version() >> 16, fabric.fi_version() & 0xffff, libc.getenv(b'FI_OFI_RXM_USE_RNDV_WRITE'))\n")
    for preset, want_when_old in ((None, b"1"), ("0", b"0")):
        env = {k: v for k, v in os.environ.items() if k != "FI_OFI_RXM_USE_RNDV_WRITE"}
        if preset is not None:
            env["FI_OFI_RXM_USE_RNDV_WRITE"] = preset
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                             timeout=60, cwd=REPO)
        assert out.returncode == 0, out.stderr
        major, minor, value = out.stdout.split(maxsplit=2)
        old = (int(major), int(minor)) < (1, 18)
        want = want_when_old if old else (preset.encode() if preset else None)
        assert value.strip() == repr(want), (preset, out.stdout)


@needs_ofi
@pytest.mark.testbed
def test_tcp_and_ofi_striped_survive_a_cut_of_the_ofi_rail(testbed_factory):
    """Rail 0 TCP, rail 1 the ofi rail over libfabric's tcp provider; one host loses rail 1's link for
    3 s during continuous 4 MiB allreduces: every result exact (numpy), the ofi rail fails over and is
    re-admitted within 8 s of the restore, and it carried data."""
    from nezha.bench.failover_drill import run_drill

    tb = testbed_factory(hosts=4, rails=2, rates=["1gbit", "1gbit"])
    rails = f"{tb.rail_subnets[0]},ofi:tcp;ofi_rxm@{tb.rail_subnets[1]}"
    # Info: rank 0 logs why each failed re-admission probe failed, which a failure here then shows.
    r = run_drill(tb, cycles=1, rail=1, fault="cut", down_s=3.0, up_s=10.0, rails=rails,
                  env={"NEZHA_LOG_LEVEL": "info"})
    assert r["returncode"] == 0, _log(r)
    assert sorted(r["reports"]) == [0, 1, 2, 3], _log(r)
    for rank, rep in r["reports"].items():
        states = [s for _, s in rep["transitions"]]
        assert states and states[0] == "down" and states[-1] == "up", (rank, rep["transitions"], _log(r))
        assert [s["kind"] for s in rep["rails"]] == ["tcp", "ofi"], rep["rails"]
        assert rep["rails"][1]["bytes_sent"] > 0, rep["rails"]
    (cycle,) = r["cycles"]
    # Target stall <= 200 ms; generous bounds for a loaded 2-core machine, as for the TCP drill.
    assert cycle["stall_s"] <= 1.0, cycle
    assert cycle["readmit_s"] <= 8.0, (cycle, _log(r))


@needs_ofi
@pytest.mark.testbed
def test_an_ofi_rail_shut_down_while_its_cable_is_out_closes_cleanly(testbed_factory):
    """The job ends while one host's rail 1 cable is still out, with rendezvous transfers to and from
    that host stalled mid-way: every rank closes the rail and exits cleanly, every result exact.
    (libfabric 1.17's tcp provider freed a stalled RMA read twice on close, and rxm's handling of
    the corrupted completions crashed in fi_close in about half of such runs.)"""
    from nezha.bench.failover_drill import run_drill

    tb = testbed_factory(hosts=4, rails=2, rates=["1gbit", "1gbit"])
    rails = f"{tb.rail_subnets[0]},ofi:tcp;ofi_rxm@{tb.rail_subnets[1]}"
    for attempt in range(3):  # each run crashed with probability ~1/2 before; three make it ~1/8
        r = run_drill(tb, cycles=1, rail=1, fault="cut", down_s=2.0, rails=rails, end_while_down=True)
        assert r["returncode"] == 0, (attempt, _log(r))
        assert "signal 11" not in r["output"], (attempt, _log(r))
        assert sorted(r["reports"]) == [0, 1, 2, 3], (attempt, _log(r))
        for rank, rep in r["reports"].items():
            assert [s for _, s in rep["transitions"]][:1] == ["down"], (attempt, rank, rep["transitions"])


@needs_ofi
@pytest.mark.testbed
def test_an_ofi_rail_shut_down_right_after_its_cable_comes_back_closes_cleanly(testbed_factory):
    """The job ends 0.3 s after rail 1's link is restored, before the ofi rail is re-admitted, with its
    operations from before the cut still posted: every rank closes the rail and exits cleanly, every
    result exact. (Closing the rxm endpoint with them posted crashed libfabric 1.17 in fi_close in
    about half of such runs.)"""
    from nezha.bench.failover_drill import run_drill

    tb = testbed_factory(hosts=4, rails=2, rates=["1gbit", "1gbit"])
    rails = f"{tb.rail_subnets[0]},ofi:tcp;ofi_rxm@{tb.rail_subnets[1]}"
    r = run_drill(tb, cycles=1, rail=1, fault="cut", down_s=3.0, up_s=0.3, rails=rails)
    assert r["returncode"] == 0, _log(r)
    assert "signal 11" not in r["output"], _log(r)
    assert sorted(r["reports"]) == [0, 1, 2, 3], _log(r)
    for rank, rep in r["reports"].items():
        assert [s for _, s in rep["transitions"]][:1] == ["down"], (rank, rep["transitions"])
