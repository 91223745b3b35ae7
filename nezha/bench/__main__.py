"""`python -m nezha.bench` is the same as the `nezha-bench` console script."""
from nezha.bench.cli import main

raise SystemExit(main())
