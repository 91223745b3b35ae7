"""``nezharun --rails auto``: ask every host of the job for its rail inventory, through the same
launch prefix or ssh the ranks will use, and choose the rails all hosts share
(nezha.rail_discovery)."""

from __future__ import annotations

import logging
import shlex
import subprocess
import sys
from typing import List, Optional

from nezha.rail_discovery import HostInventory, choose_rails, describe_hosts, discover
from nezha.runner.commands import SSH_LAUNCHER
from nezha.runner.hosts import Placement, is_local_host

log = logging.getLogger("nezha.runner")
INVENTORY_TIMEOUT_S = 30.0


def host_inventory(host: str, launcher: Optional[str]) -> HostInventory:
    """``host``'s inventory; ValueError naming the host if it cannot be asked."""
    if launcher is None and is_local_host(host):
        return discover(host)
    inventory = [sys.executable, "-m", "nezha.rail_discovery"]
    if launcher is not None:
        argv = shlex.split(launcher.replace("{host}", shlex.quote(host))) + inventory
    else:
        argv = shlex.split(SSH_LAUNCHER.replace("{host}", shlex.quote(host))) + [
            " ".join(shlex.quote(a) for a in inventory)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=INVENTORY_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ValueError(f"--rails auto: host {host} did not answer within "
                         f"{INVENTORY_TIMEOUT_S:.0f} s ({' '.join(argv)})") from None
    except OSError as exc:
        raise ValueError(f"--rails auto: cannot ask host {host}: {exc}") from None
    if done.returncode != 0:
        raise ValueError(f"--rails auto: asking host {host} failed (exit {done.returncode}): "
                         f"{done.stderr.strip()[-500:]}")
    return HostInventory.from_json(host, done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "")


def auto_rails(placements: List[Placement], launcher: Optional[str], dry_run: bool) -> Optional[str]:
    """The rail spec for --rails auto (None: the default rail); with dry_run, prints the per-host
    view and the choice to stdout."""
    hosts = list(dict.fromkeys(p.host for p in placements))
    inventories = [host_inventory(h, launcher) for h in hosts]
    spec, lines = choose_rails(inventories)
    if dry_run:
        for line in describe_hosts(inventories):
            print(line)
        for line in lines:
            print("would use " + line)
        print(f"--rails {spec}" if spec else
              "no subnet is shared by every host: the default rail (toward the rendezvous address)")
    else:
        log.info("--rails auto chose %s", spec or "the default rail")
    return spec
