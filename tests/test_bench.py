"""Tests for nezha-bench and the benchmark matrix that need no engine: parsing, formulas, reference
results, the measuring loop over an in-process thread world, Gloo on loopback, tables, JSON,
RESULTS.md and the plot."""
from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from nezha.bench import cli
from nezha.bench.measure import measure
from nezha.bench.metrics import algbw_gbps, busbw_factor, busbw_gbps, op_data_bytes
from nezha.bench.progress import ProgressReporter
from nezha.bench.records import BenchRecord, RailShare, rail_shares, read_json, write_json
from nezha.bench.report import format_rails, format_table
from nezha.bench.sizes import format_size, parse_size, parse_sizes
from nezha.bench.timing import IterationPolicy, parse_iters
from nezha.bench.workloads import (DTYPES, VerificationError, element_count, expected_output,
                                   numpy_dtype, rank_input, split_counts, verify)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import matrix_cases  # noqa: E402
import matrix_report  # noqa: E402

OPS = ("allreduce", "allgather", "broadcast", "alltoall", "reducescatter")
AVAILABLE_DTYPES = [d for d in DTYPES if d != "bfloat16"] + (
    ["bfloat16"] if __import__("importlib").util.find_spec("ml_dtypes") else [])


# --- sizes ---------------------------------------------------------------------------------------

def test_parse_sizes_uses_powers_of_1024_and_keeps_order():
    assert parse_sizes("8,1K,64K,1M,64M") == [8, 1024, 65536, 1048576, 67108864]
    assert parse_sizes("1G, 3k ,512") == [1 << 30, 3072, 512]
    assert parse_size("2MiB") == 2 << 20


@pytest.mark.parametrize("bad", ["", "1X", "0", "-4", "K", "1.5M", "8,8"])
def test_parse_sizes_rejects_bad_input(bad):
    with pytest.raises(ValueError):
        parse_sizes(bad)


@pytest.mark.parametrize("num_bytes,text", [(8, "8"), (1000, "1000"), (1024, "1K"), (1536, "1536"),
                                            (64 << 20, "64M"), (3 << 30, "3G")])
def test_format_size_is_exact_and_round_trips(num_bytes, text):
    assert format_size(num_bytes) == text
    assert parse_size(text) == num_bytes


# --- bandwidth formulas ----------------------------------------------------------------------------

def test_busbw_factors_follow_nccl_tests():
    assert busbw_factor("allreduce", 4) == pytest.approx(1.5)
    assert busbw_factor("allreduce", 1) == 0.0
    for op in ("allgather", "reducescatter", "alltoall"):
        assert busbw_factor(op, 4) == pytest.approx(0.75)
    assert busbw_factor("broadcast", 8) == 1.0
    with pytest.raises(ValueError):
        busbw_factor("gather", 4)


def test_algbw_and_busbw_in_gigabits():
    # 64 MiB in 0.5 s: 67108864 * 8 / 0.5 / 1e9 Gbit/s.
    algbw = algbw_gbps(64 << 20, 500_000.0)
    assert algbw == pytest.approx(67108864 * 8 / 0.5 / 1e9)
    assert busbw_gbps("allreduce", algbw, 4) == pytest.approx(algbw * 2 * 3 / 4)
    assert op_data_bytes("allgather", 1024, 4) == 4096
    assert op_data_bytes("reducescatter", 1024, 4) == 1024
    with pytest.raises(ValueError):
        algbw_gbps(8, 0.0)


def test_record_derives_bandwidth_from_time():
    rec = BenchRecord.measured(op="allgather", num_bytes=1 << 20, dtype="float32", ranks=4, impl="x",
                               time_us=1000.0, count=1 << 18, iters=7)
    assert rec.algbw_gbps == pytest.approx(4 * (1 << 20) * 8 / 1e-3 / 1e9)
    assert rec.busbw_gbps == pytest.approx(rec.algbw_gbps * 0.75)


# --- reference inputs and outputs -----------------------------------------------------------------

def _plain_loop_result(op, rank, world, count, dtype):
    """What `op` returns on `rank`, computed element by element with Python ints."""
    inputs = [[int(v) for v in rank_input(r, world, count, dtype)] for r in range(world)]
    splits = split_counts(count, world)
    starts = [sum(splits[:r]) for r in range(world)]
    sums = [sum(inputs[r][i] for r in range(world)) for i in range(count)]
    if op == "allreduce":
        return sums
    if op == "reducescatter":
        return sums[starts[rank]:starts[rank] + splits[rank]]
    if op == "allgather":
        return [v for r in range(world) for v in inputs[r]]
    if op == "broadcast":
        return inputs[0]
    if op == "alltoall":
        return [v for src in range(world) for v in inputs[src][starts[rank]:starts[rank] + splits[rank]]]
    raise AssertionError(op)


@pytest.mark.parametrize("dtype", AVAILABLE_DTYPES)
@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_expected_output_matches_plain_loops_and_is_exact(dtype, world):
    count = 37
    for op in OPS:
        for rank in range(world):
            want = _plain_loop_result(op, rank, world, count, dtype)
            got = expected_output(op, rank, world, count, dtype)
            assert got.dtype == numpy_dtype(dtype)
            # Exact: the reference in the benchmark's dtype equals the unbounded integer result.
            assert [int(v) for v in got] == want, (op, rank)


def test_inputs_differ_per_rank_so_misplaced_blocks_are_caught():
    for dtype in ("float32", "int8", "uint8", "float16"):
        a, b = rank_input(0, 4, 64, dtype), rank_input(1, 4, 64, dtype)
        assert not np.array_equal(a, b)
    with pytest.raises(VerificationError, match="rank 2"):
        swapped = expected_output("allgather", 0, 4, 16, "float32")[::-1].copy()
        verify("allgather on rank 2", swapped, expected_output("allgather", 0, 4, 16, "float32"))


def test_verify_names_first_bad_index():
    want = expected_output("allreduce", 0, 4, 100, "float32")
    got = want.copy()
    got[42] += 1
    with pytest.raises(VerificationError, match=r"1 of 100 elements differ.*index 42"):
        verify("nezha allreduce", got, want)
    verify("nezha allreduce", want.copy(), want)
    with pytest.raises(VerificationError, match="got 99 elements"):
        verify("x", want[:99], want)
    with pytest.raises(VerificationError, match="got dtype float64, expected float32"):
        verify("x", want.astype(np.float64), want)


def test_large_inputs_are_cheap_repeating_patterns():
    x = rank_input(3, 4, 1 << 22, "float32")
    assert x.dtype == np.float32 and x.shape == (1 << 22,)
    assert np.array_equal(x[:32], ((np.arange(32) + 3) % 16).astype(np.float32))
    assert int(expected_output("allreduce", 0, 4, 1 << 22, "float32").sum()) == \
        sum(int(rank_input(r, 4, 1 << 22, "float32").astype(np.int64).sum()) for r in range(4))


def test_element_count_and_splits():
    assert element_count("allreduce", 8, 4, 4) == 2
    assert element_count("allreduce", 2, 4, 4) == 1
    assert element_count("alltoall", 8, 4, 4) == 4        # rounded up to one element per rank
    assert element_count("reducescatter", 1030, 1, 4) == 1028
    assert split_counts(10, 4) == [3, 3, 2, 2]
    assert split_counts(3, 4) == [1, 1, 1, 0]


# --- iteration policy ----------------------------------------------------------------------------

def test_auto_iterations_aim_for_one_second_within_bounds():
    auto = IterationPolicy()
    assert auto.timed_iterations(10_000.0) == 100      # 10 ms per iteration -> 1 s
    assert auto.timed_iterations(1.0) == 200           # capped
    assert auto.timed_iterations(2_000_000.0) == 5     # at least 5
    assert IterationPolicy(iters=7).timed_iterations(1.0) == 7
    assert parse_iters("auto") is None and parse_iters("12") == 12
    for bad in ("0", "-1", "many"):
        with pytest.raises(ValueError):
            parse_iters(bad)


# --- command line --------------------------------------------------------------------------------

def test_cli_defaults_and_options():
    args = cli.parse_args([])
    assert (args.op, args.dtype, args.iters, args.baseline) == ("allreduce", "float32", None, None)
    assert args.sizes == [8, 1024, 65536, 1 << 20, 64 << 20]
    args = cli.parse_args(["--op", "alltoall", "--sizes", "1K,2M", "--iters", "9", "--dtype", "int8",
                           "--baseline", "gloo", "--gloo-ifname", "rail0,rail1", "--impl-label", "nezha-2rails",
                           "--json", "out.json"])
    assert (args.op, args.sizes, args.iters, args.dtype) == ("alltoall", [1024, 2 << 20], 9, "int8")
    assert cli.baseline_label(args) == "gloo-rail0+rail1"
    assert args.impl_label == "nezha-2rails" and args.json == "out.json"
    assert cli.baseline_label(cli.parse_args(["--baseline", "gloo"])) == "gloo"


@pytest.mark.parametrize("argv", [["--op", "gather"], ["--sizes", "1X"], ["--iters", "0"],
                                  ["--gloo-ifname", "eth0"], ["--warmup", "-1"], ["--dtype", "complex64"],
                                  ["--baseline", "gloo", "--impl-label", "gloo"]])
def test_cli_rejects_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.parse_args(argv)
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err


def test_module_entry_point_prints_help():
    proc = subprocess.run([sys.executable, "-m", "nezha.bench", "--help"], capture_output=True, text=True,
                          timeout=60, cwd=REPO)
    assert proc.returncode == 0
    assert "--baseline" in proc.stdout and "--impl-label" in proc.stdout


# --- the measuring loop over ranks as threads -------------------------------------------------------

class ThreadWorld:
    """Ranks as threads; `exchange` is an allgather of Python objects."""

    def __init__(self, world: int):
        self.world = world
        self._barrier = threading.Barrier(world, timeout=20)
        self._slots = [None] * world

    def exchange(self, rank, value):
        self._slots[rank] = value
        self._barrier.wait()
        values = list(self._slots)
        self._barrier.wait()
        return values

    def barrier(self):
        self._barrier.wait()


class ThreadCoordinator:
    def __init__(self, tw: ThreadWorld, rank: int):
        self.tw, self.rank, self.world = tw, rank, tw.world

    def barrier(self):
        self.tw.barrier()

    def max_over_ranks(self, value):
        return max(self.tw.exchange(self.rank, value))

    def sum_over_ranks(self, values):
        return [sum(col) for col in zip(*self.tw.exchange(self.rank, list(values)))]


class LoopBackend:
    """Collectives by plain loops over exchanged inputs; rank r is slower by r ms per iteration and
    sends 3x more bytes on rail "r0" than on "r1"."""

    def __init__(self, tw, rank, corrupt_rank=None):
        self.tw, self.rank, self.impl = tw, rank, "loops"
        self.corrupt_rank = corrupt_rank
        self.sent = [0, 0]

    def prepare(self, op, count, dtype):
        x = rank_input(self.rank, self.tw.world, count, dtype)

        def collective():
            self.tw.exchange(self.rank, None)
            time.sleep(0.001 * (self.rank + 1))
            self.sent[0] += 3 * count
            self.sent[1] += count
            out = np.array(_plain_loop_result(op, self.rank, self.tw.world, count, dtype)).astype(x.dtype)
            if self.rank == self.corrupt_rank:
                out[-1] += 1
            return out

        class Step:
            run = staticmethod(collective)
            run_checked = staticmethod(collective)
        return Step()

    def rail_bytes(self):
        return ["r0", "r1"], list(self.sent)


def _run_ranks(world, body):
    tw = ThreadWorld(world)
    results, errors = [None] * world, [None] * world

    def target(rank):
        try:
            results[rank] = body(tw, rank)
        except BaseException as exc:  # collected and asserted on below
            errors[rank] = exc
            tw._barrier.abort()
    threads = [threading.Thread(target=target, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results, errors


@pytest.mark.parametrize("op", OPS)
def test_measure_agrees_over_ranks(op):
    policy = IterationPolicy(warmup=1, target_s=0.05, min_iters=3, max_iters=50)
    results, errors = _run_ranks(4, lambda tw, r: measure(LoopBackend(tw, r), ThreadCoordinator(tw, r),
                                                          op, 256, "float32", policy))
    assert errors == [None] * 4
    first = results[0]
    assert all(rec == first for rec in results), "every rank must report the same record"
    assert first.time_us >= 4000          # the slowest rank (4 ms) sets the time
    assert 3 <= first.iters < 50          # ~4 ms per iteration against a 50 ms target
    assert [r.name for r in first.rails] == ["r0", "r1"]
    assert [r.share for r in first.rails] == pytest.approx([0.75, 0.25])
    assert first.rails[0].bytes == 4 * 3 * first.iters * first.count
    assert first.ranks == 4 and first.op == op and first.impl == "loops"


class WaitingBackend:
    """One rank's calls that take 3 ms each, of this thread's CPU (spinning: however loaded the
    machine) or asleep."""

    def __init__(self, spin: bool):
        self.impl, self.spin = "waits", spin

    def prepare(self, op, count, dtype):
        x = rank_input(0, 1, count, dtype)

        def collective():
            end = time.thread_time() + 0.003
            while self.spin and time.thread_time() < end:
                pass
            if not self.spin:
                time.sleep(0.003)
            return x.copy()

        class Step:
            run = staticmethod(collective)
            run_checked = staticmethod(collective)
        return Step()

    def rail_bytes(self):
        return [], []


@pytest.mark.parametrize("spin", [True, False])
def test_measure_reports_the_cpu_a_call_takes(spin):
    policy = IterationPolicy(iters=20, warmup=1)
    (record,), errors = _run_ranks(1, lambda tw, r: measure(WaitingBackend(spin), ThreadCoordinator(tw, r),
                                                            "allreduce", 256, "float32", policy))
    assert errors == [None]
    assert record.time_us >= 3000
    if spin:
        assert 2900 <= record.cpu_us <= 4500  # the 3 ms spinning, and the loop's own work
    else:
        assert record.cpu_us < 1000           # asleep: the loop's own overhead only
    assert BenchRecord.from_json(record.to_json()) == record


def test_measure_fails_loudly_on_a_wrong_result():
    policy = IterationPolicy(iters=2, warmup=0)
    _, errors = _run_ranks(3, lambda tw, r: measure(LoopBackend(tw, r, corrupt_rank=2),
                                                    ThreadCoordinator(tw, r), "allreduce", 64, "int32", policy))
    assert isinstance(errors[2], VerificationError)
    assert "loops allreduce 64 (16 x int32) on rank 2" in str(errors[2])


# --- Gloo baseline on loopback (two processes) ------------------------------------------------------

GLOO_WORKER = textwrap.dedent("""
    import sys, numpy as np
    from nezha.bench.gloo_baseline import GlooBaseline, encode_endpoint
    from nezha.bench.workloads import expected_output
    rank, port = int(sys.argv[1]), int(sys.argv[2])

    class FakeNezha:  # just what the bootstrap needs; the endpoint is fixed by the test
        def rank(self): return rank
        def size(self): return 2
        def rail_stats(self): return [{"name": "lo", "local_addr": "127.0.0.1", "bytes_sent": 0}]
        def broadcast(self, buf, root, name=None): return encode_endpoint("127.0.0.1", port)

    gloo = GlooBaseline(FakeNezha(), "gloo-lo", None, timeout_s=30)
    assert gloo.ifnames == "lo", gloo.ifnames
    for dtype in ("float32", "int8", "float16"):
        for op in ("allreduce", "allgather", "broadcast", "alltoall", "reducescatter"):
            step = gloo.prepare(op, 6, dtype)
            step.run()
            got = step.run_checked()
            want = expected_output(op, rank, 2, 6, dtype)
            assert np.array_equal(got.astype(np.float64), want.astype(np.float64)), (op, dtype, got, want)
    gloo.close()
    print("ok", rank)
""")


@pytest.mark.slow  # two processes importing torch: ~10-20 s on a loaded 2-core machine
def test_gloo_baseline_collectives_match_the_reference():
    pytest.importorskip("torch")
    from nezha.bench.gloo_baseline import pick_free_port
    port = pick_free_port("127.0.0.1")
    procs = [subprocess.Popen([sys.executable, "-c", GLOO_WORKER, str(rank), str(port)], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(2)]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=90))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for rank, (proc, (out, err)) in enumerate(zip(procs, outputs)):
        assert proc.returncode == 0, f"rank {rank}: {err[-2000:]}"
        assert f"ok {rank}" in out


def test_endpoint_encoding_round_trips():
    from nezha.bench.gloo_baseline import decode_endpoint, encode_endpoint
    assert decode_endpoint(encode_endpoint("10.50.0.1", 40123)) == ("10.50.0.1", 40123)
    with pytest.raises(ValueError):
        decode_endpoint(np.zeros(128, dtype=np.uint8))


# --- table, JSON, progress -------------------------------------------------------------------------

def _rec(impl, num_bytes, time_us, rails=(), op="allreduce", ranks=4):
    return BenchRecord.measured(op=op, num_bytes=num_bytes, dtype="float32", ranks=ranks, impl=impl,
                                time_us=time_us, count=num_bytes // 4, iters=5, rails=list(rails))


def test_table_has_nccl_tests_columns_and_baseline_ratio():
    shares = rail_shares(["10.50.0.0/24", "10.51.0.0/24"], [600, 400])
    ours = [_rec("nezha", 8, 120.0, shares), _rec("nezha", 64 << 20, 400_000.0, shares)]
    theirs = [_rec("gloo-rail0", 64 << 20, 800_000.0)]
    lines = format_table(ours, theirs).splitlines()
    assert lines[0].split()[:6] == ["size", "count", "dtype", "time(us)", "algbw(Gb/s)", "busbw(Gb/s)"]
    assert "gloo-rail0 time(us)" in lines[0] and "ratio" in lines[0] and lines[0].rstrip().endswith("rails")
    assert lines[1].split()[:4] == ["8", "2", "float32", "120.00"]
    assert "- - -" in " ".join(lines[1].split())        # no baseline at 8 bytes
    big = lines[2].split()
    assert big[0] == "64M" and big[4] == f"{ours[1].algbw_gbps:.3f}" and "2.00x" in big
    assert lines[2].endswith("10.50.0.0/24 60% 10.51.0.0/24 40%")
    # Right-aligned numeric columns: every row has the same width up to the rails column.
    assert len({line.index("10.50") for line in lines[1:]}) == 1


def test_rail_shares_and_formatting():
    shares = rail_shares(["a", "b", "c"], [0, 300, 100])
    assert [s.share for s in shares] == pytest.approx([0.0, 0.75, 0.25])
    assert format_rails(shares) == "a 0% b 75% c 25%"
    assert format_rails([]) == "-"
    assert format_rails(rail_shares(["a", "b"], [0, 0])) == "none"
    assert [s.share for s in rail_shares(["a"], [0])] == [0.0]
    with pytest.raises(ValueError):
        rail_shares(["a"], [1, 2])


def test_json_records_have_the_contract_fields(tmp_path):
    recs = [_rec("nezha-2rails", 1024, 50.0, rail_shares(["r0", "r1"], [1, 3])), _rec("gloo", 1024, 90.0)]
    path = tmp_path / "out.json"
    write_json(str(path), recs)
    raw = json.loads(path.read_text())
    for item in raw:
        assert {"op", "bytes", "dtype", "ranks", "impl", "time_us", "algbw_gbps", "busbw_gbps",
                "rails"} <= set(item)
    assert raw[0]["rails"] == [{"name": "r0", "bytes": 1, "share": 0.25}, {"name": "r1", "bytes": 3, "share": 0.75}]
    assert read_json(str(path)) == recs


def test_progress_prints_one_line_per_size_when_not_a_terminal():
    stream = io.StringIO()
    with ProgressReporter(total=2, enabled=True, stream=stream) as progress:
        for rec in (_rec("nezha", 8, 100.0), _rec("nezha", 1024, 200.0)):
            progress.starting(rec.impl, rec.op, rec.bytes)
            progress.finished(rec)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and lines[1].startswith("nezha-bench: nezha allreduce 1K float32: 200.0 us")
    silent = io.StringIO()
    with ProgressReporter(total=1, enabled=False, stream=silent) as progress:
        progress.finished(_rec("nezha", 8, 1.0))
    assert silent.getvalue() == ""


# --- benchmark matrix ------------------------------------------------------------------------------

SUBNETS = ["10.50.0.0/24", "10.51.0.0/24"]


def test_matrix_cases_cover_the_issue():
    cases = matrix_cases.build_cases(SUBNETS, quick=False)
    assert [c.key for c in cases] == ["a", "b", "c"]
    assert cases[0].rates == ("1gbit", "1gbit") and cases[1].rates == ("1gbit", "250mbit")
    assert cases[2].rates == ("off", "off")
    for case in cases[:2]:
        assert case.sizes == "8,1K,64K,1M,16M,64M"
        assert sorted(case.impls) == sorted(["nezha-2rails", "gloo-rail0+rail1", "nezha-rail0", "gloo-rail0",
                                             "nezha-rail1", "nezha-mptcp"])
        assert {r.rails for r in case.runs} == {"10.50.0.0/24,10.51.0.0/24", "10.50.0.0/24", "10.51.0.0/24",
                                                "mptcp:10.50.0.0/24"}
    assert set(cases[2].impls) == {"nezha-2rails", "gloo-rail0"}
    quick = matrix_cases.build_cases(SUBNETS, quick=True)
    assert len(parse_sizes(quick[0].sizes)) < len(parse_sizes(cases[0].sizes))


def test_matrix_command_line():
    testbed_args = ["--launcher", "ip netns exec {host}", "-H", "h0:1,h1:1", "--rendezvous-addr", "10.50.0.254",
                    "--rails", "10.50.0.0/24,10.51.0.0/24"]
    case = matrix_cases.build_cases(SUBNETS, quick=False)[0]
    run = case.runs[3]  # mptcp
    argv = matrix_cases.run_command(run, case, testbed_args, "/tmp/x.json", quick=False, python="py")
    sep = argv.index("--")
    launcher, bench = argv[:sep], argv[sep + 1:]
    assert launcher[:5] == ["py", "-m", "nezha.runner", "-np", "4"]
    assert launcher.count("--rails") == 1 and launcher[launcher.index("--rails") + 1] == "mptcp:10.50.0.0/24"
    assert "ip netns exec {host}" in launcher
    assert bench[:3] == ["py", "-m", "nezha.bench"] and "--baseline" not in bench
    assert bench[bench.index("--impl-label") + 1] == "nezha-mptcp"
    gloo_argv = matrix_cases.run_command(case.runs[0], case, testbed_args, "/tmp/y.json", quick=True, python="py")
    assert gloo_argv[gloo_argv.index("--gloo-ifname") + 1] == "rail0,rail1"
    assert gloo_argv[gloo_argv.index("--iters") + 1] == "5"
    assert matrix_cases.replace_flag(["--rails=a", "-x", "--rails", "b", "y"], "--rails", "c") == \
        ["-x", "y", "--rails", "c"]


def _sample_results():
    cases = {c.key: c for c in matrix_cases.build_cases(SUBNETS, quick=False)}
    mb64 = 64 << 20
    split = rail_shares(SUBNETS, [80, 20])
    a = matrix_report.CaseResult(cases["a"], commands=["nezharun -np 4 ... a"])
    # busbw = 64 MiB * 8 * 1.5 / t: choose times for 1.9, 1.3, 0.95 Gbit/s.
    def at(gbps):
        return mb64 * 8 * 1.5 / (gbps * 1e3)
    a.records = [_rec("nezha-2rails", mb64, at(1.9), split), _rec("nezha-mptcp", mb64, at(1.3)),
                 _rec("gloo-rail0", mb64, at(0.95)), _rec("nezha-2rails", 8, 300.0, split)]
    a.traffic = {"nezha-mptcp": [3_000_000_000, 1_000_000_000]}
    b = matrix_report.CaseResult(cases["b"], errors=["b-nezha-rail1: timed out"])
    b.records = [_rec("nezha-2rails", mb64, at(1.0)), _rec("nezha-rail0", mb64, at(0.96))]
    c = matrix_report.CaseResult(cases["c"])
    c.records = [_rec("nezha-2rails", 8, 90.0), _rec("gloo-rail0", 8, 100.0),
                 _rec("nezha-2rails", 1024, 95.0), _rec("gloo-rail0", 1024, 90.0)]
    return [a, b, c]


def test_targets_are_evaluated_from_the_records():
    verdicts = [(t.case, met) for t, (met, _) in matrix_report.evaluate_targets(_sample_results())]
    assert verdicts == [("a", True), ("a", None), ("b", False), ("a", None), ("b", True),
                        ("c", None), ("c", None), ("d", None)]
    assert all(met is None for _, (met, _) in matrix_report.evaluate_targets([]))


def test_bandwidth_targets_use_the_largest_size_when_big_enough():
    case_a = matrix_cases.build_cases(SUBNETS, quick=True)[0]
    quick = matrix_report.CaseResult(case_a, records=[_rec("nezha-2rails", 16 << 20, 1000.0),
                                                      _rec("gloo-rail0", 16 << 20, 2000.0)])
    met, detail = matrix_report.evaluate_targets([quick])[0][1]
    assert met is True and "at 16M" in detail
    small = matrix_report.CaseResult(case_a, records=[_rec("nezha-2rails", 1 << 20, 10.0)])
    assert matrix_report.evaluate_targets([small])[0][1][0] is None


def test_results_markdown_has_commands_tables_and_targets():
    text = matrix_report.render_results(_sample_results(), quick=False, started="2024-01-01 00:00",
                                        duration_s=123, testbed="4 namespaces")
    assert text.startswith("# Nezha benchmark matrix")
    assert "| case | target | result | measured |" in text
    assert "NOT met" in text and "| met |" in text and "not measured" in text
    assert "## Case (a): two 1 Gbit/s rails" in text and "## Case (b)" in text and "## Case (c)" in text
    assert "| size | nezha-2rails | nezha-mptcp | gloo-rail0 |" in text  # nezha variants, then Gloo
    assert "| 64M | 1.900 | 1.300 | 0.950 |" in text
    assert "- nezha-2rails: 10.50.0.0/24 80% 10.51.0.0/24 20%" in text
    assert "```\nnezharun -np 4 ... a\n```" in text
    assert "- b-nezha-rail1: timed out" in text
    assert "- nezha-mptcp: rail0 3.00 GB (75%), rail1 1.00 GB (25%)" in text
    assert matrix_report.traffic_text([0, 0]) == "rail0 0.00 GB (0%), rail1 0.00 GB (0%)"


def test_plot_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    import busbw_plot
    path = tmp_path / "busbw.png"
    busbw_plot.write_plot(_sample_results(), str(path))
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
