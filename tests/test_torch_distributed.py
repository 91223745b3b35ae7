"""The torch.distributed backend "nezha" in real processes: every operation against torch
references under nezharun (3 and 4 ranks) and torchrun, every way init_process_group starts
(env://, tcp://, file://, an explicit store, Slurm and Open MPI environments, a device map, twice
in one process)."""

import os
import socket
import subprocess
import sys

import pytest

from torch_workers.harness import HERE, REPO, assert_every_rank_passed, run_workers

pytest.importorskip("torch")

OPS = {"init under %s", "all_reduce every op x dtype", "async works and futures",
       "synchronous calls lead the engine's loop", "coalesced operations", "broadcast every root and dtype",
       "all_gather lists, tensors, objects", "reduce_scatter list and tensor",
       "all_to_all single and lists", "gather, scatter, reduce, object lists, barrier",
       "point-to-point", "new_group sub-groups", "bad input raises at the call"}
LAUNCHER_VARS = ("NEZHA_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_",
                 "MASTER_", "OMPI_", "PMI_", "MPI_LOCAL", "SLURM_", "TORCHELASTIC_")


def ops_expected(launcher, ranks):
    expected = {c % launcher if "%s" in c else c for c in OPS}
    return expected | ({"2-D DeviceMesh groups"} if ranks == 4 else set())


@pytest.mark.timeout(240)
@pytest.mark.parametrize("ranks", [3, 4])
def test_every_operation_under_nezharun(ranks):
    output = run_workers("w_dist_ops.py", num_ranks=ranks, timeout_s=200, args=["nezharun"])
    assert_every_rank_passed(output, ranks, ops_expected("nezharun", ranks))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_VARS)}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env["NEZHA_TIMEOUT_S"] = "20"
    env.update(extra)
    return env


def run_ranks(envs, args, timeout_s=120):
    """One process per env running tests/torch_workers/w_dist_init.py with `args`; returns the
    outputs, each tagged so assert_every_rank_passed reads them."""
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "w_dist_init.py"), *args],
                              cwd=REPO, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for e in envs]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout_s)[0])
    finally:
        for p in procs:
            p.kill()
    for p, out in zip(procs, outs):
        assert p.returncode == 0, "\n".join(outs)
    return "\n".join(outs)


@pytest.mark.timeout(240)
def test_every_operation_under_torchrun():
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=3",
           "--master_port=%d" % free_port(), os.path.join(HERE, "w_dist_ops.py"), "torchrun"]
    proc = subprocess.run(cmd, cwd=REPO, env=clean_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=200)
    assert proc.returncode == 0, proc.stdout
    assert_every_rank_passed(proc.stdout, 3, ops_expected("torchrun", 3))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["tcp", "file", "store"])
def test_init_method_and_explicit_store(mode, tmp_path):
    where = {"tcp": "127.0.0.1:%d" % free_port(), "file": str(tmp_path / "rendezvous"),
             "store": str(free_port())}[mode]
    output = run_ranks([clean_env(RANK=str(r), WORLD_SIZE="3") for r in range(3)],
                       [mode, where])
    assert_every_rank_passed(output, 3, {"init %s" % mode})


@pytest.mark.timeout(120)
def test_init_under_slurm():
    job_id = str(40000 + free_port() % 20000)
    output = run_ranks([clean_env(SLURM_PROCID=str(r), SLURM_NTASKS="2", SLURM_LOCALID=str(r),
                                  SLURM_NTASKS_PER_NODE="2", SLURM_NODEID="0",
                                  SLURM_JOB_ID=job_id, SLURM_JOB_NODELIST="localhost")
                        for r in range(2)], ["env"])
    assert_every_rank_passed(output, 2, {"init env"})


@pytest.mark.timeout(120)
def test_init_under_open_mpi():
    port = str(free_port())
    output = run_ranks([clean_env(OMPI_COMM_WORLD_RANK=str(r), OMPI_COMM_WORLD_SIZE="2",
                                  OMPI_COMM_WORLD_LOCAL_RANK=str(r),
                                  OMPI_COMM_WORLD_LOCAL_SIZE="2", MASTER_ADDR="127.0.0.1",
                                  MASTER_PORT=port) for r in range(2)], ["env"])
    assert_every_rank_passed(output, 2, {"init env"})


@pytest.mark.timeout(120)
def test_device_map_and_a_second_init_after_destroy():
    output = run_workers("w_dist_init.py", num_ranks=2, timeout_s=100, args=["device-map"])
    assert_every_rank_passed(output, 2, {"init device-map"})
    output = run_workers("w_dist_init.py", num_ranks=2, timeout_s=100, args=["reinit"])
    assert_every_rank_passed(output, 2, {"init reinit",
                                         "destroy leaves nothing behind and a second init works"})


TRAINING = {"DDP matches one process", "DDP gradient_as_bucket_view matches one process",
            "DDP static_graph matches one process", "DDP small buckets matches one process",
            "DDP no_sync matches one process", "DDP comm hook fp16_compress_hook",
            "DDP comm hook bf16_compress_hook", "DDP comm hook PowerSGD",
            "FSDP2 matches one process"}


@pytest.mark.timeout(300)
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="no CUDA device")
def test_ddp_on_cuda_tensors_matches_one_process():
    output = run_workers("w_dist_train.py", num_ranks=2, timeout_s=240, args=["cuda"])
    assert_every_rank_passed(output, 2, {c for c in TRAINING if c.startswith("DDP ") and
                                         "hook" not in c} | {"DDP matches one process"})


@pytest.mark.timeout(300)
@pytest.mark.parametrize("ranks", [2, 4])
def test_ddp_and_fsdp2_match_one_process(ranks):
    output = run_workers("w_dist_train.py", num_ranks=ranks, timeout_s=240)
    expected = TRAINING | ({"HSDP 2 x 2 matches one process"} if ranks == 4 else set())
    assert_every_rank_passed(output, ranks, expected)


@pytest.mark.timeout(120)
def test_mismatches_and_the_timeout_raise_on_every_rank():
    output = run_workers("w_dist_failures.py", num_ranks=2, timeout_s=100, args=["mismatch"])
    assert_every_rank_passed(output, 2, {"mismatches raise on every rank and the group goes on",
                                         "the group's timeout is honoured"})


@pytest.mark.timeout(120)
def test_a_dead_rank_is_named_on_every_other_rank():
    from conftest import assert_victim_named, launch_direct
    results = launch_direct(3, "../torch_workers/w_dist_failures.py", "dead", str(free_port()),
                            "2", env={"NEZHA_TIMEOUT_S": "10"}, timeout=90)
    assert_victim_named(results, victim=2, survivors=[0, 1], within_s=15)


@pytest.mark.timeout(120)
def test_a_script_that_never_imports_nezha_gets_the_backend_under_nezharun(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text(
        "import os, sys, torch, torch.distributed as dist\n"
        "dist.init_process_group('nezha')\n"
        "t = torch.ones(2) * (dist.get_rank() + 1); dist.all_reduce(t)\n"
        "print('PASS[%d] plain script %s user site %s' % (dist.get_rank(), t.tolist(),\n"
        "      os.environ.get('USER_SITE_RAN')), flush=True)\n"
        "dist.destroy_process_group()\n")
    # A sitecustomize of the user's own, which nezharun's must not hide.
    user_site = tmp_path / "site"
    user_site.mkdir()
    (user_site / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = 'yes'\n")
    cmd = [sys.executable, "-m", "nezha.runner.launch", "-np", "2", sys.executable, str(script)]
    env = {**os.environ, "PYTHONPATH": str(user_site)}
    proc = subprocess.run(cmd, cwd=str(tmp_path), env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=100)
    assert proc.returncode == 0, proc.stdout
    for rank in range(2):
        assert "PASS[%d] plain script [3.0, 3.0] user site yes" % rank in proc.stdout, proc.stdout
    # A job that never imports torch does not import it for the backend's sake.
    cmd = [sys.executable, "-m", "nezha.runner.launch", "-np", "1", sys.executable, "-c",
           "import sys, json; import numpy; print('TORCH', 'torch' in sys.modules)"]
    proc = subprocess.run(cmd, cwd=str(tmp_path), env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=100)
    assert "TORCH False" in proc.stdout, proc.stdout


@pytest.mark.timeout(180)
def test_lightning_ddp_strategy_matches_one_process():
    pytest.importorskip("lightning")
    output = run_workers("w_dist_lightning.py", num_ranks=2, timeout_s=150)
    assert_every_rank_passed(output, 2, {
        "Lightning DDPStrategy(process_group_backend='nezha') matches one process"})


@pytest.mark.timeout(120)
def test_a_scripts_own_tcp_rendezvous_is_left_alone_under_nezharun(tmp_path):
    """nezharun's store is for env:// only: a script that names its own tcp:// address (Gloo's
    DDP baseline does) still gets rank 0 serving it there."""
    script = tmp_path / "own_tcp.py"
    script.write_text(
        "import os, sys, torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo', init_method='tcp://127.0.0.1:%s' % sys.argv[1],\n"
        "                        rank=int(os.environ['RANK']), world_size=2)\n"
        "t = torch.ones(2); dist.all_reduce(t)\n"
        "print('PASS[%d] own tcp %s' % (dist.get_rank(), t.tolist()), flush=True)\n"
        "dist.destroy_process_group()\n")
    cmd = [sys.executable, "-m", "nezha.runner.launch", "-np", "2", sys.executable, str(script),
           str(free_port())]
    proc = subprocess.run(cmd, cwd=REPO, env=clean_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=100)
    assert proc.returncode == 0, proc.stdout
    for rank in range(2):
        assert "PASS[%d] own tcp [2.0, 2.0]" % rank in proc.stdout, proc.stdout
