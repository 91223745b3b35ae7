"""`python -m nezha.sim`: see nezha/sim/cli.py."""
import sys

from .cli import main

sys.exit(main())
