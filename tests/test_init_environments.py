"""init() without nezharun: torchrun, Open MPI, MPICH and Slurm environments, and a lone process."""
import os
import socket
import subprocess
import sys

import pytest

from conftest import REPO, WORKERS

SCRIPT = str(WORKERS / "env_allreduce.py")
LAUNCHER_VARS = ("NEZHA_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "MASTER_", "OMPI_", "PMI_", "MPI_LOCAL", "SLURM_")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env():
    return {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_VARS)}


def launch(envs):
    procs = [subprocess.Popen([sys.executable, SCRIPT], cwd=REPO, env={**clean_env(), **e},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for e in envs]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=90)[0])
    finally:
        for p in procs:
            p.kill()
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out
    return outs


def test_single_process_without_any_launcher():
    (out,) = launch([{}])
    assert "OK rank=0 size=1 local_rank=0 local_size=1 cross_rank=0 cross_size=1" in out


def test_torchrun_environment():
    port = free_port() - 1  # Nezha's store goes on MASTER_PORT + 1
    outs = launch([{"RANK": str(r), "WORLD_SIZE": "3", "LOCAL_RANK": str(r),
                    "LOCAL_WORLD_SIZE": "3", "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port)} for r in range(3)])
    for r, out in enumerate(outs):
        assert f"OK rank={r} size=3 local_rank={r} local_size=3" in out, out


def test_open_mpi_environment():
    port = free_port()
    outs = launch([{"OMPI_COMM_WORLD_RANK": str(r), "OMPI_COMM_WORLD_SIZE": "2",
                    "OMPI_COMM_WORLD_LOCAL_RANK": str(r), "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
                    "NEZHA_RENDEZVOUS_ADDR": "127.0.0.1", "NEZHA_RENDEZVOUS_PORT": str(port)}
                   for r in range(2)])
    for r, out in enumerate(outs):
        assert f"OK rank={r} size=2" in out, out


def test_mpich_environment():
    port = free_port()
    outs = launch([{"PMI_RANK": str(r), "PMI_SIZE": "2", "MPI_LOCALRANKID": str(r),
                    "MPI_LOCALNRANKS": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
                   for r in range(2)])
    for r, out in enumerate(outs):
        assert f"OK rank={r} size=2 local_rank={r} local_size=2" in out, out


def test_slurm_environment_finds_the_store_on_the_first_node():
    job_id = str(40000 + free_port() % 20000)
    outs = launch([{"SLURM_PROCID": str(r), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(r),
                    "SLURM_NTASKS_PER_NODE": "2", "SLURM_NODEID": "0", "SLURM_JOB_ID": job_id,
                    "SLURM_JOB_NODELIST": "localhost"} for r in range(2)])
    for r, out in enumerate(outs):
        assert f"OK rank={r} size=2 local_rank={r} local_size=2 cross_rank=0 cross_size=1" in out


def test_nezharun_environment(job):
    result = job(2, "env_allreduce.py")
    assert result.returncode == 0, result.output
    assert "OK rank=1 size=2 local_rank=1 local_size=2" in result.lines(1)[0]
