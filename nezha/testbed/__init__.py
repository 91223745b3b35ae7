"""Multi-host, multi-rail testbed on one Linux machine: hosts are network namespaces, rails are bridges.

    with Testbed(hosts=4, rails=2, rates=["1gbit", "1gbit"]) as tb:
        tb.exec("...-h0", ["python", "train.py"])

CLI: `python -m nezha.testbed up|down|rate|link|status|nezharun-args` (see `--help`).
"""

from .availability import testbed_available
from .commands import CommandError, TestbedError
from .shaping import parse_rate
from .testbed import Testbed, unique_prefix
from .traffic import Transfer, measure

__all__ = ["Testbed", "testbed_available", "TestbedError", "CommandError", "unique_prefix", "parse_rate",
           "measure", "Transfer"]
