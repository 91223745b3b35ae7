"""torch.distributed's ``env://`` variables where the launcher sets only its own.

``init_process_group`` reads ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``.
nezharun and torchrun export them; Open MPI, MPICH and Slurm do not, so ``import nezha.torch``
fills them in from the variables those launchers do set, the way ``nezha.init()`` reads them
(nezha/environ.py): rank 0's host and port are ``MASTER_ADDR``/``MASTER_PORT`` or
``NEZHA_RENDEZVOUS_ADDR``/``PORT`` where given, and under Slurm the first node of the job with a
port derived from the job id. Nothing is changed where ``RANK`` and ``WORLD_SIZE`` are set already
or where no launcher is recognised.
"""
from __future__ import annotations

import os
from typing import MutableMapping, Optional

from nezha import environ

_LAUNCHERS = ("openmpi", "mpich", "slurm")


def fill_torch_env(env: Optional[MutableMapping[str, str]] = None) -> bool:
    """Sets the env:// variables from an MPI or Slurm launch; True when it set them."""
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        return False
    try:
        info = environ.detect(env)
    except ValueError:  # a launcher's variables half set: torch's own error will say what
        return False
    if info.source not in _LAUNCHERS:
        return False
    env.update({"RANK": str(info.rank), "WORLD_SIZE": str(info.size),
                "LOCAL_RANK": str(info.local_rank), "LOCAL_WORLD_SIZE": str(info.local_size),
                "GROUP_RANK": str(info.cross_rank), "GROUP_WORLD_SIZE": str(info.cross_size)})
    env.setdefault("MASTER_ADDR", info.rendezvous_addr)
    env.setdefault("MASTER_PORT", str(info.rendezvous_port))
    return True
