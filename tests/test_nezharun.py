"""nezharun end to end on this machine (python -c ranks), plus its host-list and command helpers."""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import nezha
from nezha.runner.commands import build_rank_command
from nezha.runner.env import JobSettings, timeline_path
from nezha.runner.hosts import (HostSlots, Placement, parse_host_list, parse_hostfile,
                                place_ranks)

# Where the nezha package being tested lives, so the ranks import the same one.
PACKAGE_ROOT = pathlib.Path(nezha.__file__).resolve().parents[1]
PY = sys.executable


def nezharun(*args, timeout=60, **popen_kwargs):
    """Runs nezharun to completion; returns the CompletedProcess (text output)."""
    popen_kwargs.setdefault("cwd", PACKAGE_ROOT)  # 'python -m' puts the cwd first on sys.path
    return subprocess.run([PY, "-m", "nezha.runner.launch", *args], capture_output=True,
                          text=True, timeout=timeout, env=_env(), **popen_kwargs)


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(PACKAGE_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    for k in [k for k in env if k.startswith("NEZHA_")]:
        del env[k]
    return env


def lines_of(output, rank, stream="stdout"):
    prefix = f"[{rank}]<{stream}>: "
    return [line[len(prefix):] for line in output.splitlines() if line.startswith(prefix)]


def script(body):
    return textwrap.dedent(body).strip()


# --- end to end ----------------------------------------------------------------------------------

PRINT_ENV_AND_MEET = script("""
    import json, os
    from nezha.environ import detect
    from nezha.rendezvous.bootstrap import join
    world = detect()
    rdzv = join(world, timeout_s=20)
    rdzv.client.set(f"hello/{world.rank}", str(world.rank).encode())
    rdzv.client.wait([f"hello/{r}" for r in range(world.size)], timeout_s=20)
    print(json.dumps({k: v for k, v in os.environ.items() if k.startswith("NEZHA_")}))
    rdzv.close()
""")


def test_three_ranks_get_their_environment_and_meet_at_the_store():
    result = nezharun("-np", "3", PY, "-c", PRINT_ENV_AND_MEET)
    assert result.returncode == 0, result.stderr
    envs = [json.loads(lines_of(result.stdout, r)[0]) for r in range(3)]
    secrets_seen = {e["NEZHA_SECRET"] for e in envs}
    assert len(secrets_seen) == 1 and len(secrets_seen.pop()) == 64
    for rank, env in enumerate(envs):
        assert env["NEZHA_RANK"] == str(rank)
        assert env["NEZHA_SIZE"] == "3"
        assert (env["NEZHA_LOCAL_RANK"], env["NEZHA_LOCAL_SIZE"]) == (str(rank), "3")
        assert (env["NEZHA_CROSS_RANK"], env["NEZHA_CROSS_SIZE"]) == ("0", "1")
        assert env["NEZHA_RENDEZVOUS_ADDR"] == "127.0.0.1"
        assert "NEZHA_RAILS" not in env and "NEZHA_TIMELINE" not in env


def test_hosts_fill_in_order_and_rails_and_timeline_are_passed(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# two local names stand for two hosts\nlocalhost slots=2\n127.0.0.1:4\n")
    code = "import os, json; print(json.dumps(dict(os.environ)))"
    result = nezharun("-np", "3", "--hostfile", str(hostfile), "--rails", "lo",
                      "--timeline", str(tmp_path / "tl.json"), "--", PY, "-c", code)
    assert result.returncode == 0, result.stderr
    envs = [json.loads(lines_of(result.stdout, r)[0]) for r in range(3)]
    layout = [(e["NEZHA_LOCAL_RANK"], e["NEZHA_LOCAL_SIZE"], e["NEZHA_CROSS_RANK"],
               e["NEZHA_CROSS_SIZE"]) for e in envs]
    assert layout == [("0", "2", "0", "2"), ("1", "2", "0", "2"), ("0", "1", "1", "2")]
    assert all(e["NEZHA_RAILS"] == "lo" for e in envs)
    assert [e["NEZHA_TIMELINE"] for e in envs] == [str(tmp_path / f"tl.{r}.json")
                                                   for r in range(3)]


def test_horovod_layout_variables_are_set_beside_nezhas(tmp_path):
    # Horovod scripts read HOROVOD_RANK, HOROVOD_SIZE, ... (issue 16): same values, host as listed.
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\n127.0.0.1:4\n")
    code = "import os, json; print(json.dumps(dict(os.environ)))"
    result = nezharun("-np", "3", "--hostfile", str(hostfile), "--", PY, "-c", code)
    assert result.returncode == 0, result.stderr
    envs = [json.loads(lines_of(result.stdout, r)[0]) for r in range(3)]
    for e in envs:
        for what in ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE"):
            assert e["HOROVOD_" + what] == e["NEZHA_" + what], what
    assert [e["HOROVOD_RANK"] for e in envs] == ["0", "1", "2"]
    assert [e["HOROVOD_HOSTNAME"] for e in envs] == ["localhost", "localhost", "127.0.0.1"]
    # The host entry is also what shared memory's same-host rule compares (shm_address.h).
    assert [e["NEZHA_HOST_ID"] for e in envs] == ["localhost", "localhost", "127.0.0.1"]


def test_ranks_sharing_a_host_get_one_openmp_thread_unless_the_user_chose(tmp_path):
    # As under torchrun: a BLAS/OpenMP pool per rank sized to the whole host oversubscribes it.
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\n127.0.0.1:4\n")
    code = "import os; print(os.environ.get('OMP_NUM_THREADS', 'unset'))"
    for chosen in (None, "3"):
        env = _env()
        env.pop("OMP_NUM_THREADS", None)
        if chosen:
            env["OMP_NUM_THREADS"] = chosen
        result = subprocess.run([PY, "-m", "nezha.runner.launch", "-np", "3", "--hostfile",
                                 str(hostfile), "--", PY, "-c", code], capture_output=True,
                                text=True, timeout=60, env=env, cwd=PACKAGE_ROOT)
        assert result.returncode == 0, result.stderr
        seen = [lines_of(result.stdout, r)[0] for r in range(3)]
        if chosen:
            assert seen == ["3", "3", "3"], (seen, result.stderr)
        else:  # ranks 0 and 1 share localhost; rank 2 is alone on its host
            assert seen == ["1", "1", "unset"], (seen, result.stderr)


def test_output_lines_are_prefixed_per_rank_and_stream():
    code = script("""
        import os, sys
        r = os.environ["NEZHA_RANK"]
        for i in range(50):
            print(f"out {r} line {i} " + "x" * 200)
        sys.stderr.write(f"err {r}\\n")
        sys.stdout.write(f"tail {r} without newline")
    """)
    result = nezharun("-np", "2", PY, "-c", code)
    assert result.returncode == 0, result.stderr
    for rank in range(2):
        out = lines_of(result.stdout, rank)
        assert out == [f"out {rank} line {i} " + "x" * 200 for i in range(50)] + \
            [f"tail {rank} without newline"]
        assert lines_of(result.stderr, rank, "stderr") == [f"err {rank}"]
    # Every line is whole: nothing but prefixed lines on stdout.
    assert all(re.match(r"^\[[01]\]<stdout>: ", line) for line in result.stdout.splitlines())


FAIL_RANK_2 = script("""
    import os, sys, time
    if os.environ["NEZHA_RANK"] == "2":
        time.sleep(0.5)
        print("rank 2 gives up", flush=True)
        sys.exit(3)
    time.sleep(60)
""")


def test_a_failing_rank_stops_the_others_with_its_exit_code():
    started = time.monotonic()
    result = nezharun("-np", "4", PY, "-c", FAIL_RANK_2)
    assert result.returncode == 3
    assert time.monotonic() - started < 30  # the sleepers were stopped, not waited for
    assert lines_of(result.stdout, 2) == ["rank 2 gives up"]
    reasons = [l for l in result.stderr.splitlines() if l.startswith("nezharun:")]
    assert reasons == ["nezharun: rank 2 on host localhost exited with code 3; "
                       "stopped 3 other ranks"]


def test_a_rank_killed_by_a_signal_and_a_rank_ignoring_sigterm():
    code = script("""
        import os, signal, time
        if os.environ["NEZHA_RANK"] == "1":
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGKILL)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # rank 0 must be SIGKILLed
        time.sleep(60)
    """)
    started = time.monotonic()
    result = nezharun("-np", "2", PY, "-c", code)
    assert result.returncode == 128 + signal.SIGKILL
    assert time.monotonic() - started < 30
    assert result.stderr.strip().splitlines()[-1] == (
        "nezharun: rank 1 on host localhost was killed by SIGKILL (exit code 137); "
        "stopped 1 other rank")


def test_command_not_found_is_reported():
    result = nezharun("-np", "2", "/nonexistent/program")
    assert result.returncode == 127
    assert "rank 0 on host localhost could not start '/nonexistent/program'" in result.stderr


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_to_nezharun_stops_every_rank(tmp_path, signum, code):
    body = script(f"""
        import os, time
        pathlib_dir = {str(tmp_path)!r}
        with open(os.path.join(pathlib_dir, "pid." + os.environ["NEZHA_RANK"]), "w") as f:
            f.write(str(os.getpid()))
        time.sleep(120)
    """)
    proc = subprocess.Popen([PY, "-m", "nezha.runner.launch", "-np", "3", PY, "-c", body],
                            env=_env(), cwd=PACKAGE_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while len(list(tmp_path.glob("pid.*"))) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        pids = [int(p.read_text()) for p in tmp_path.glob("pid.*")]
        assert len(pids) == 3
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code
    assert f"interrupted by {signal.Signals(signum).name}; stopped 3 ranks" in err
    for pid in pids:
        assert not pathlib.Path(f"/proc/{pid}").exists(), f"rank pid {pid} survived"


def test_secret_is_in_no_command_line():
    code = script("""
        import os
        secret = os.environ["NEZHA_SECRET"].encode()
        assert len(secret) == 64
        seen = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/cmdline", "rb") as f:
                        if secret in f.read():
                            seen.append(entry)
                except OSError:
                    pass
        print("cmdlines with secret:", seen)
    """)
    result = nezharun("-np", "2", PY, "-c", code)
    assert result.returncode == 0, result.stderr
    assert lines_of(result.stdout, 0) == ["cmdlines with secret: []"]
    assert lines_of(result.stdout, 1) == ["cmdlines with secret: []"]


def test_launcher_prefix_runs_each_hosts_ranks_with_the_environment():
    code = "import os; print(os.environ['HOST_FROM_PREFIX'], os.environ['NEZHA_CROSS_RANK'], " \
           "len(os.environ['NEZHA_SECRET']))"
    result = nezharun("-np", "3", "-H", "hostA:1,hostB:2", "--rendezvous-addr", "127.0.0.1",
                      "--launcher", "env HOST_FROM_PREFIX={host}", PY, "-c", code)
    assert result.returncode == 0, result.stderr
    assert [lines_of(result.stdout, r) for r in range(3)] == [
        ["hostA 0 64"], ["hostB 1 64"], ["hostB 1 64"]]


def test_start_timeout_names_the_ranks_that_never_arrived():
    code = script("""
        import os, time
        from nezha.environ import detect
        from nezha.rendezvous.bootstrap import join
        if os.environ["NEZHA_RANK"] != "1":
            join(detect(), timeout_s=20)
        time.sleep(60)
    """)
    started = time.monotonic()
    result = nezharun("-np", "3", "--start-timeout", "3", PY, "-c", code)
    assert result.returncode == 124
    assert time.monotonic() - started < 30
    assert result.stderr.strip().splitlines()[-1] == (
        "nezharun: rank 1 did not reach the rendezvous store within 3 s; stopped 3 ranks")


@pytest.mark.parametrize("args, message", [
    (["-np", "3", "-H", "localhost:2", "true"], "-np 3 exceeds the 2 slots"),
    (["-np", "1", "--rails", "nosuchnic0", "true"], "rail nosuchnic0"),
    (["-np", "2", "-H", "no-such-host.invalid:2", "true"], "pass --rendezvous-addr"),
])
def test_bad_arguments_fail_before_starting_anything(args, message):
    result = nezharun(*args)
    assert result.returncode == 2
    assert message in result.stderr


# --- helpers -------------------------------------------------------------------------------------

def test_parse_host_list():
    assert parse_host_list("h1:2, h2 ,h3:1,h1:1") == [HostSlots("h1", 3), HostSlots("h2", 1),
                                                     HostSlots("h3", 1)]
    for bad in ["h1:x", "h1:0", ":2", ","]:
        with pytest.raises(ValueError):
            parse_host_list(bad)


def test_parse_hostfile(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("# cluster\n\nnode1 slots=4\nnode2:2   # comment\nnode3\n"
                    "node4 slots = 8\n")
    assert parse_hostfile(str(path)) == [HostSlots("node1", 4), HostSlots("node2", 2),
                                         HostSlots("node3", 1), HostSlots("node4", 8)]
    path.write_text("node1 slots=4\nnode2 cpus=3\n")
    with pytest.raises(ValueError, match="line 2"):
        parse_hostfile(str(path))
    path.write_text("# nothing\n")
    with pytest.raises(ValueError, match="names no host"):
        parse_hostfile(str(path))


def test_place_ranks_fills_hosts_in_order_and_skips_unused_hosts():
    placements = place_ranks([HostSlots("a", 2), HostSlots("b", 2), HostSlots("c", 4)], 3)
    assert placements == [Placement(0, "a", 0, 2, 0, 2), Placement(1, "a", 1, 2, 0, 2),
                          Placement(2, "b", 0, 1, 1, 2)]


def test_timeline_path():
    assert timeline_path("/x/trace.json", 3) == "/x/trace.3.json"
    assert timeline_path("trace", 0) == "trace.0"


def test_ssh_command_passes_the_secret_on_stdin_only(tmp_path):
    job = JobSettings(size=2, rendezvous_addr="10.0.0.1", rendezvous_port=1234,
                      secret_hex="cd" * 32, rails="10.50.0.0/24")
    placement = Placement(1, "remote-node", 0, 1, 1, 2)
    command = build_rank_command(placement, job, [PY, "-c", "import os, json; print(json.dumps("
                                 "{k: v for k, v in os.environ.items() if 'NEZHA' in k}))"],
                                 launcher=None, base_env={"NEZHA_LOG_LEVEL": "debug"},
                                 cwd=str(tmp_path))
    assert command.how == "ssh"
    assert command.argv[:4] == ["ssh", "-o", "BatchMode=yes", "remote-node"]
    assert "cd" * 32 not in " ".join(command.argv)
    assert command.stdin_data == ("cd" * 32 + "\n").encode()
    # Run the remote half under a local shell, as sshd would.
    result = subprocess.run(["sh", "-c", command.argv[-1]], input=command.stdin_data,
                            capture_output=True, timeout=30, env={"PATH": os.environ["PATH"]})
    env = json.loads(result.stdout)
    assert env["NEZHA_SECRET"] == "cd" * 32
    assert (env["NEZHA_RANK"], env["NEZHA_CROSS_RANK"], env["NEZHA_RAILS"]) == ("1", "1",
                                                                               "10.50.0.0/24")
    assert env["NEZHA_LOG_LEVEL"] == "debug"  # knobs travel to remote ranks
