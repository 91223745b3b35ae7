"""How one rank is started on its host: directly, behind a launch prefix, or over ssh.

The job secret never appears on a command line (command lines are world-readable through
/proc/<pid>/cmdline): local ranks and launch prefixes inherit it through the process environment,
ssh ranks receive it on stdin and the remote shell reads it into the environment.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from typing import Dict, List, Mapping, Optional, Sequence

from nezha.runner.env import SECRET_VAR, JobSettings, forwarded_knobs, rank_environment
from nezha.runner.hosts import Placement, is_local_host

SSH_LAUNCHER = "ssh -o BatchMode=yes {host}"
# Put first on every rank's PYTHONPATH: its sitecustomize registers torch.distributed's backend
# "nezha" for scripts that never import nezha (site/sitecustomize.py).
SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "site")


@dataclasses.dataclass
class RankCommand:
    """Everything needed to spawn one rank."""

    placement: Placement
    argv: List[str]
    env: Dict[str, str] = dataclasses.field(repr=False)
    stdin_data: Optional[bytes] = dataclasses.field(default=None, repr=False)
    how: str = "direct"  # "direct", "prefix" or "ssh", for --verbose


def build_rank_command(placement: Placement, job: JobSettings, command: Sequence[str],
                       launcher: Optional[str], base_env: Mapping[str, str],
                       cwd: str) -> RankCommand:
    """The process to spawn for ``placement``; ``launcher`` is a template with ``{host}``."""
    rank_env = rank_environment(placement, job)
    if launcher is not None or is_local_host(placement.host):
        rank_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (SITE_DIR, base_env.get("PYTHONPATH")) if p)
    if launcher is not None:
        prefix = shlex.split(launcher.replace("{host}", shlex.quote(placement.host)))
        return RankCommand(placement, prefix + list(command), {**base_env, **rank_env},
                           how="prefix")
    if is_local_host(placement.host):
        return RankCommand(placement, list(command), {**base_env, **rank_env})
    return _ssh_command(placement, rank_env, command, base_env, cwd)


def _ssh_command(placement: Placement, rank_env: Dict[str, str], command: Sequence[str],
                 base_env: Mapping[str, str], cwd: str) -> RankCommand:
    public = {**forwarded_knobs(dict(base_env)), **rank_env}
    secret = public.pop(SECRET_VAR)
    assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(public.items()))
    # Runs under the remote login shell (sh-compatible). 'read' takes the first stdin line, so the
    # secret only ever travels inside the encrypted ssh channel.
    # The remote PYTHONPATH is kept, behind the site folder (the same path on every host, as is
    # the command's interpreter).
    pythonpath = f"PYTHONPATH={shlex.quote(SITE_DIR)}${{PYTHONPATH:+:$PYTHONPATH}}"
    remote = (f"cd {shlex.quote(cwd)} 2>/dev/null; IFS= read -r {SECRET_VAR} && "
              f"export {SECRET_VAR} && exec env {assignments} {pythonpath} "
              f"{' '.join(shlex.quote(a) for a in command)}")
    argv = shlex.split(SSH_LAUNCHER.replace("{host}", shlex.quote(placement.host))) + [remote]
    return RankCommand(placement, argv, dict(base_env), stdin_data=(secret + "\n").encode(),
                       how="ssh")
