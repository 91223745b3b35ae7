"""``python -m nezha.runner`` is ``nezharun``."""

import sys

from nezha.runner.launch import main

sys.exit(main())
