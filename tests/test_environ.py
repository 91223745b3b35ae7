"""detect(): every launcher's environment, the overrides, and errors that name the variable."""

import dataclasses

import pytest

from nezha.environ import (WorldInfo, detect, expand_slurm_nodelist,
                           parse_slurm_tasks_per_node)

SECRET_HEX = "ab" * 32


def nezharun_env(**overrides):
    env = {"NEZHA_RANK": "5", "NEZHA_SIZE": "8", "NEZHA_LOCAL_RANK": "1", "NEZHA_LOCAL_SIZE": "4",
           "NEZHA_CROSS_RANK": "1", "NEZHA_CROSS_SIZE": "2", "NEZHA_RENDEZVOUS_ADDR": "10.0.0.1",
           "NEZHA_RENDEZVOUS_PORT": "4242", "NEZHA_SECRET": SECRET_HEX, "NEZHA_RAILS": "eth1,eth2"}
    env.update(overrides)
    return {k: v for k, v in env.items() if v is not None}


def torchrun_env(**overrides):
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
           "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "MASTER_ADDR": "node0",
           "MASTER_PORT": "29500"}
    env.update(overrides)
    return {k: v for k, v in env.items() if v is not None}


def test_nothing_set_is_a_single_process_that_hosts_its_store():
    info = detect({})
    assert info == WorldInfo(rank=0, size=1, local_rank=0, local_size=1, cross_rank=0,
                             cross_size=1, rendezvous_addr="127.0.0.1", rendezvous_port=0,
                             secret=b"", rails=None, source="single", host_store=True)


def test_nezharun_variables():
    info = detect(nezharun_env())
    assert (info.rank, info.size, info.local_rank, info.local_size) == (5, 8, 1, 4)
    assert (info.cross_rank, info.cross_size) == (1, 2)
    assert (info.rendezvous_addr, info.rendezvous_port) == ("10.0.0.1", 4242)
    assert info.secret == bytes.fromhex(SECRET_HEX)
    assert info.rails == "eth1,eth2"
    assert info.source == "nezharun" and info.host_store is False


def test_nezharun_takes_precedence_over_other_launchers():
    env = {**torchrun_env(), **nezharun_env(), "OMPI_COMM_WORLD_RANK": "0"}
    assert detect(env).source == "nezharun"


def test_secret_is_not_in_the_repr():
    assert SECRET_HEX not in repr(detect(nezharun_env()))
    assert "secret" not in repr(detect(nezharun_env()))


def test_cross_rank_is_derived_when_not_given():
    info = detect(nezharun_env(NEZHA_CROSS_RANK=None, NEZHA_CROSS_SIZE=None))
    assert (info.cross_rank, info.cross_size) == (5 // 4, 8 // 4)


@pytest.mark.parametrize("var, value, message", [
    ("NEZHA_RANK", None, "NEZHA_RANK is not set"),
    ("NEZHA_RANK", "two", "NEZHA_RANK='two' is not an integer"),
    ("NEZHA_RANK", "8", "rank 8 is outside"),
    ("NEZHA_LOCAL_SIZE", None, "NEZHA_LOCAL_SIZE is not set"),
    ("NEZHA_LOCAL_RANK", "4", "local rank 4"),
    ("NEZHA_RENDEZVOUS_ADDR", None, "NEZHA_RENDEZVOUS_ADDR is not set"),
    ("NEZHA_RENDEZVOUS_PORT", "70000", "NEZHA_RENDEZVOUS_PORT=70000 is not a valid TCP port"),
    ("NEZHA_SECRET", "xyz", "NEZHA_SECRET must be a hex string"),
    ("NEZHA_CROSS_RANK", "2", "NEZHA_CROSS_RANK=2 is outside"),
    ("NEZHA_CROSS_RANK", None, "NEZHA_CROSS_RANK is not set"),  # size given alone
])
def test_nezharun_errors_name_the_variable(var, value, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        detect(nezharun_env(**{var: value}))


def test_heterogeneous_layout_without_cross_vars_is_an_error():
    env = nezharun_env(NEZHA_SIZE="5", NEZHA_RANK="4", NEZHA_LOCAL_SIZE="2", NEZHA_LOCAL_RANK="0",
                       NEZHA_CROSS_RANK=None, NEZHA_CROSS_SIZE=None)
    with pytest.raises(ValueError, match="NEZHA_CROSS_RANK and NEZHA_CROSS_SIZE"):
        detect(env)


def test_torchrun_uses_master_port_plus_one_and_rank0_hosts():
    info = detect(torchrun_env())
    assert (info.rank, info.size, info.local_rank, info.local_size) == (3, 4, 1, 2)
    assert (info.cross_rank, info.cross_size) == (1, 2)
    assert (info.rendezvous_addr, info.rendezvous_port) == ("node0", 29501)
    assert info.source == "torchrun" and info.host_store is False and info.secret == b""
    rank0 = detect(torchrun_env(RANK="0", LOCAL_RANK="0", GROUP_RANK="0"))
    assert rank0.host_store is True


def test_torchrun_overrides_and_derived_group_size():
    info = detect(torchrun_env(NEZHA_RENDEZVOUS_PORT="5000", NEZHA_RENDEZVOUS_ADDR="10.1.1.1",
                               GROUP_WORLD_SIZE=None, NEZHA_SECRET="00ff", NEZHA_RAILS="lo"))
    assert (info.rendezvous_addr, info.rendezvous_port) == ("10.1.1.1", 5000)
    assert (info.cross_rank, info.cross_size) == (1, 2)
    assert info.secret == b"\x00\xff" and info.rails == "lo"


@pytest.mark.parametrize("var, message", [
    ("MASTER_ADDR", "MASTER_ADDR is not set"),
    ("MASTER_PORT", "MASTER_PORT is not set"),
    ("LOCAL_WORLD_SIZE", "LOCAL_WORLD_SIZE is not set"),
])
def test_torchrun_missing_variables(var, message):
    with pytest.raises(ValueError, match=message):
        detect(torchrun_env(**{var: None}))


def test_torchrun_master_port_at_the_top_leaves_no_room():
    with pytest.raises(ValueError, match="NEZHA_RENDEZVOUS_PORT"):
        detect(torchrun_env(MASTER_PORT="65535"))


def test_openmpi_with_master_addr():
    env = {"OMPI_COMM_WORLD_RANK": "6", "OMPI_COMM_WORLD_SIZE": "8",
           "OMPI_COMM_WORLD_LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
           "MASTER_ADDR": "head", "MASTER_PORT": "7000"}
    info = detect(env)
    assert (info.rank, info.size, info.local_rank, info.local_size) == (6, 8, 2, 4)
    assert (info.cross_rank, info.cross_size) == (1, 2)
    assert (info.rendezvous_addr, info.rendezvous_port) == ("head", 7000)
    assert info.source == "openmpi" and not info.host_store
    assert detect({**env, "OMPI_COMM_WORLD_RANK": "0",
                   "OMPI_COMM_WORLD_LOCAL_RANK": "0"}).host_store


def test_openmpi_without_any_store_address_is_an_error():
    env = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2",
           "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    with pytest.raises(ValueError, match="NEZHA_RENDEZVOUS_ADDR"):
        detect(env)


def test_mpich_with_nezha_store_address_and_explicit_cross():
    env = {"PMI_RANK": "4", "PMI_SIZE": "5", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1",
           "NEZHA_RENDEZVOUS_ADDR": "10.0.0.9", "NEZHA_RENDEZVOUS_PORT": "6000",
           "NEZHA_CROSS_RANK": "3", "NEZHA_CROSS_SIZE": "4", "MASTER_ADDR": "ignored",
           "MASTER_PORT": "1"}
    info = detect(env)
    assert (info.rank, info.size, info.local_rank, info.local_size) == (4, 5, 0, 1)
    assert (info.cross_rank, info.cross_size) == (3, 4)
    assert (info.rendezvous_addr, info.rendezvous_port) == ("10.0.0.9", 6000)
    assert info.source == "mpich"


def test_mpich_missing_local_size():
    with pytest.raises(ValueError, match="MPI_LOCALNRANKS"):
        detect({"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0",
                "MASTER_ADDR": "h", "MASTER_PORT": "1"})


def slurm_env(**overrides):
    env = {"SLURM_PROCID": "4", "SLURM_NTASKS": "7", "SLURM_LOCALID": "1", "SLURM_NODEID": "2",
           "SLURM_NNODES": "4", "SLURM_TASKS_PER_NODE": "2(x3),1",
           "SLURM_JOB_NODELIST": "node[01-03],gpu5", "SLURM_JOB_ID": "123456"}
    env.update(overrides)
    return {k: v for k, v in env.items() if v is not None}


def test_slurm_heterogeneous_nodes_use_the_node_id():
    info = detect(slurm_env())
    assert (info.rank, info.size, info.local_rank, info.local_size) == (4, 7, 1, 2)
    assert (info.cross_rank, info.cross_size) == (2, 4)
    assert info.rendezvous_addr == "node01"
    assert info.rendezvous_port == 15000 + 123456 % 15000
    assert info.source == "slurm" and not info.host_store
    last = detect(slurm_env(SLURM_PROCID="6", SLURM_LOCALID="0", SLURM_NODEID="3"))
    assert (last.local_size, last.cross_rank) == (1, 3)


def test_slurm_ntasks_per_node_and_master_addr():
    env = slurm_env(SLURM_TASKS_PER_NODE=None, SLURM_NTASKS_PER_NODE="2", SLURM_NTASKS="4",
                    SLURM_NNODES="2", SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NODEID="0",
                    MASTER_ADDR="head", MASTER_PORT="9000")
    info = detect(env)
    assert (info.local_size, info.cross_rank, info.cross_size) == (2, 0, 2)
    assert (info.rendezvous_addr, info.rendezvous_port, info.host_store) == ("head", 9000, True)


def test_slurm_errors():
    with pytest.raises(ValueError, match="SLURM_NODEID=5"):
        detect(slurm_env(SLURM_NODEID="5"))
    with pytest.raises(ValueError, match="SLURM_JOB_ID"):
        detect(slurm_env(SLURM_JOB_ID=None))
    with pytest.raises(ValueError, match="SLURM_TASKS_PER_NODE"):
        detect(slurm_env(SLURM_TASKS_PER_NODE="2(y3)"))
    with pytest.raises(ValueError, match="SLURM_NTASKS_PER_NODE"):
        detect(slurm_env(SLURM_TASKS_PER_NODE=None))


@pytest.mark.parametrize("nodelist, expected", [
    ("node01", ["node01"]),
    ("node[01-03,07],gpu5", ["node01", "node02", "node03", "node07", "gpu5"]),
    ("a[8-11]", ["a8", "a9", "a10", "a11"]),
    ("r[1-2]n[01-02]", ["r1n01", "r1n02", "r2n01", "r2n02"]),
    ("x-[3],y[009-010]-ib", ["x-3", "y009-ib", "y010-ib"]),
])
def test_expand_slurm_nodelist(nodelist, expected):
    assert expand_slurm_nodelist(nodelist) == expected


@pytest.mark.parametrize("nodelist", ["node[01-03", "node01]", "node[a-b]", "n[1-]", ""])
def test_expand_slurm_nodelist_rejects_malformed_lists(nodelist):
    with pytest.raises(ValueError, match="SLURM_JOB_NODELIST"):
        expand_slurm_nodelist(nodelist)


def test_parse_slurm_tasks_per_node():
    assert parse_slurm_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert parse_slurm_tasks_per_node("4") == [4]


def test_world_info_is_frozen():
    info = detect({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.rank = 3
