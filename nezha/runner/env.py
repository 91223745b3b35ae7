"""The environment nezharun gives each rank: the NEZHA_* contract read by ``nezha.environ``, and the
same layout under Horovod's HOROVOD_* names."""

from __future__ import annotations

import dataclasses
import os
from typing import Dict, Optional

from nezha.runner.hosts import Placement

SECRET_VAR = "NEZHA_SECRET"


@dataclasses.dataclass(frozen=True)
class JobSettings:
    """What every rank of the job shares."""

    size: int
    rendezvous_addr: str
    rendezvous_port: int
    secret_hex: str = dataclasses.field(repr=False)
    rails: Optional[str] = None
    timeline: Optional[str] = None
    # MASTER_ADDR, MASTER_PORT, ... of the torch.distributed store nezharun serves (torch_store.py)
    torch_store: Dict[str, str] = dataclasses.field(default_factory=dict)


def rank_environment(placement: Placement, job: JobSettings) -> Dict[str, str]:
    """The NEZHA_* variables of one rank, secret included (callers decide how to pass it)."""
    env = {
        "NEZHA_RANK": str(placement.rank),
        "NEZHA_SIZE": str(job.size),
        "NEZHA_LOCAL_RANK": str(placement.local_rank),
        "NEZHA_LOCAL_SIZE": str(placement.local_size),
        "NEZHA_CROSS_RANK": str(placement.cross_rank),
        "NEZHA_CROSS_SIZE": str(placement.cross_size),
        "NEZHA_RENDEZVOUS_ADDR": job.rendezvous_addr,
        "NEZHA_RENDEZVOUS_PORT": str(job.rendezvous_port),
        # The host entry as the host list names it: shared memory joins only ranks of one entry.
        "NEZHA_HOST_ID": placement.host,
        SECRET_VAR: job.secret_hex,
        # Ranks' output goes through pipes; unbuffered Python keeps it timely and ordered.
        "PYTHONUNBUFFERED": os.environ.get("PYTHONUNBUFFERED", "1"),
    }
    # Horovod's names for the same layout: Horovod scripts and tools read these (gloo's launcher
    # sets them); HOROVOD_HOSTNAME is the host as the host list names it.
    for what in ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE"):
        env["HOROVOD_" + what] = env["NEZHA_" + what]
    env["HOROVOD_HOSTNAME"] = placement.host
    # torch.distributed's names (torchrun's), so init_process_group's env:// works as under
    # torchrun; GROUP_RANK is torchrun's index of the host.
    env.update({"RANK": env["NEZHA_RANK"], "WORLD_SIZE": env["NEZHA_SIZE"],
                "LOCAL_RANK": env["NEZHA_LOCAL_RANK"], "LOCAL_WORLD_SIZE": env["NEZHA_LOCAL_SIZE"],
                "GROUP_RANK": env["NEZHA_CROSS_RANK"], "GROUP_WORLD_SIZE": env["NEZHA_CROSS_SIZE"],
                **job.torch_store})
    env.update(thread_defaults(placement, os.environ))
    if job.rails:
        env["NEZHA_RAILS"] = job.rails
    if job.timeline:
        env["NEZHA_TIMELINE"] = timeline_path(job.timeline, placement.rank)
    return env


def thread_defaults(placement: Placement, environ: Dict[str, str]) -> Dict[str, str]:
    """OMP_NUM_THREADS=1 for a rank that shares its host with others, unless the user set it (as
    torchrun does): every rank's BLAS/OpenMP pool would otherwise size itself to the whole host, and
    its idle workers spin on the cores the other ranks and their engines need."""
    if placement.local_size > 1 and "OMP_NUM_THREADS" not in environ:
        return {"OMP_NUM_THREADS": "1"}
    return {}


def timeline_path(path: str, rank: int) -> str:
    """Per-rank timeline file: the rank goes before the extension (``trace.json`` ->
    ``trace.3.json``; ``trace`` -> ``trace.3``)."""
    directory, name = os.path.split(path)
    stem, ext = os.path.splitext(name)
    return os.path.join(directory, f"{stem}.{rank}{ext}")


def forwarded_knobs(environ: Dict[str, str]) -> Dict[str, str]:
    """NEZHA_* knobs set for nezharun itself (log level, fusion threshold...) that remote ranks
    should see too; job-layout variables and the secret are excluded (nezharun sets those)."""
    layout = {"NEZHA_RANK", "NEZHA_SIZE", "NEZHA_LOCAL_RANK", "NEZHA_LOCAL_SIZE",
              "NEZHA_CROSS_RANK", "NEZHA_CROSS_SIZE", "NEZHA_HOST_ID", "NEZHA_RENDEZVOUS_ADDR",
              "NEZHA_RENDEZVOUS_PORT", SECRET_VAR, "NEZHA_RAILS", "NEZHA_TIMELINE"}
    return {k: v for k, v in environ.items() if k.startswith("NEZHA_") and k not in layout}
