"""PyTorch's own distributed test suite against a backend: the ``_DistTestBase`` tests of
``torch/testing/_internal/distributed/distributed_test.py`` (shipped in the torch wheel), run the
way PyTorch's ``test/distributed/test_distributed_spawn.py`` runs them for gloo: one spawned
process per rank, ``init_process_group`` through a file:// store, every test in a fresh group.

    python benchmarks/torch_distributed_suite.py --backend nezha --world-size 3 --json out.json
    python benchmarks/torch_distributed_suite.py --backend gloo  --world-size 3 --json gloo.json

For "nezha" the suite's feature sets are told that the backend does DDP and sub-groups and takes
CUDA tensors (the suite skips those tests for any backend outside its lists of gloo/nccl/ucc);
nothing else of the suite is changed. With --gloo-gated, the tests the suite runs for Gloo alone
(`@require_backend_is_available({"gloo"})`: coalesced allreduces, batched send/recv, ...; and
those skipped unless BACKEND is "gloo": barrier timeouts, batched send/recv with tags) run with
"nezha" too: the suite's source is executed with those checks also accepting "nezha" (the file
on disk is not touched). --mpi-gated does the same for the CPU all_to_all tests the suite keeps for
MPI and the DDP comm-hook tests it keeps for mpi/nccl/gloo ("get_future is only supported ...").
Prints the counts (passed, failed, skipped, errors) and, with --json, each test's outcome and
message (and F.partial after every test). Counts for both backends are in benchmarks/RESULTS.md.
"""
import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
import types
import unittest

# The spawned ranks re-import this module as __mp_main__: what they need is set up at import.
os.environ.setdefault("BACKEND", "nezha")
os.environ.setdefault("WORLD_SIZE", "3")
os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="nezha-dist-suite-"))
os.environ.setdefault("NEZHA_TIMEOUT_S", "30")

import torch  # noqa: E402

torch.set_num_threads(1)
SUITE = "torch.testing._internal.distributed.distributed_test"
# Each gate: its text in the suite, how many times it is there, and the text that lets "nezha" in.
GATES = {
    "NEZHA_SUITE_GLOO_GATED": [
        ("    if BACKEND not in backends:\n", 1,
         "    if BACKEND not in backends and not (BACKEND == 'nezha' and 'gloo' in backends):\n"),
        ('BACKEND != "gloo", "Only gloo backend supports timeouts"', 4,
         'BACKEND not in ("gloo", "nezha"), "Only gloo backend supports timeouts"'),
        ('BACKEND != "gloo", "GLOO Batch Send Recv CPU"', 2,
         'BACKEND not in ("gloo", "nezha"), "GLOO Batch Send Recv CPU"')],
    "NEZHA_SUITE_MPI_GATED": [
        ('BACKEND != "mpi", "Only MPI supports', 12, 'BACKEND not in ("mpi", "nezha"), "Only MPI supports'),
        ('BACKEND != "mpi" and BACKEND != "nccl" and BACKEND != "gloo",', 5,
         'BACKEND not in ("mpi", "nccl", "gloo", "nezha"),'),
        # Those comm-hook tests build their CPU model only for these two by name.
        ('            if BACKEND == "mpi" or BACKEND == "gloo":\n', 1,
         '            if BACKEND in ("mpi", "gloo", "nezha"):\n')],
}
if os.environ["BACKEND"] == "nezha":
    import nezha.torch  # noqa: E402,F401  (registers the backend)
    from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402
    # It does DDP and sub-groups, and takes CUDA tensors (staged through host memory): the tests
    # that need a GPU still skip on a machine without one.
    for feature in ("ddp", "subgroup", "plugin", "gpu", "cuda"):
        DistTestCases.backend_feature[feature].add("nezha")
    opened = [gate for flag, gates in GATES.items() if os.environ.get(flag) == "1" for gate in gates]
    if opened:
        spec = importlib.util.find_spec(SUITE)
        source = open(spec.origin).read()
        for text, count, replacement in opened:
            if source.count(text) != count:
                raise SystemExit("the suite's backend check %r is not where it was expected" % text)
            source = source.replace(text, replacement)
        module = types.ModuleType(SUITE)
        module.__file__ = spec.origin
        sys.modules[SUITE] = module
        exec(compile(source, spec.origin, "exec"), module.__dict__)

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest, TestDistBackend)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


class _Recorder(unittest.TextTestResult):
    # Where each outcome is written as it comes (a run cut short still leaves what it got).
    progress_path = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.outcomes = {}
        self._started = {}

    def startTest(self, test):
        self._started[test.id()] = time.monotonic()
        super().startTest(test)

    def _record(self, test, outcome, message=""):
        name = test.id().rsplit(".", 1)[-1]
        self.outcomes[name] = {"outcome": outcome, "message": str(message)[-1500:],
                               "seconds": round(time.monotonic() - self._started.get(test.id(),
                                                                                     0), 1)}
        if self.progress_path:
            with open(self.progress_path, "w") as f:
                json.dump(self.outcomes, f, indent=1)

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "passed")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, "failed", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self._record(test, "error", self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record(test, "skipped", reason)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default=os.environ["BACKEND"])
    parser.add_argument("--world-size", type=int, default=int(os.environ["WORLD_SIZE"]))
    parser.add_argument("-k", dest="pattern", action="append", default=[],
                        help="only tests whose name contains this (repeatable)")
    parser.add_argument("--gloo-gated", action="store_true",
                        help="nezha only: also run the tests the suite gates to Gloo alone")
    parser.add_argument("--mpi-gated", action="store_true",
                        help="nezha only: also run the CPU all_to_all and comm-hook tests the "
                             "suite gates to MPI (and to mpi/nccl/gloo)")
    parser.add_argument("--json", help="write each test's outcome here")
    args = parser.parse_args()
    wanted = {"BACKEND": args.backend, "WORLD_SIZE": str(args.world_size),
              "NEZHA_SUITE_GLOO_GATED": "1" if args.gloo_gated else "0",
              "NEZHA_SUITE_MPI_GATED": "1" if args.mpi_gated else "0"}
    if any(os.environ.get(k, "0") != v for k, v in wanted.items()):
        # The spawned ranks read the environment: re-run with it set.
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **wanted})
    loader = unittest.TestLoader()
    if args.pattern:
        loader.testNamePatterns = ["*%s*" % p for p in args.pattern]
    suite = loader.loadTestsFromTestCase(TestDistBackendWithSpawn)
    if args.json:
        _Recorder.progress_path = args.json + ".partial"
    runner = unittest.TextTestRunner(resultclass=_Recorder, verbosity=1, stream=sys.stderr)
    started = time.monotonic()
    result = runner.run(suite)
    counts = {k: sum(1 for o in result.outcomes.values() if o["outcome"] == k)
              for k in ("passed", "failed", "error", "skipped")}
    print(json.dumps({"backend": args.backend, "world_size": args.world_size,
                      "seconds": round(time.monotonic() - started), **counts}))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"backend": args.backend, "world_size": args.world_size,
                       "counts": counts, "tests": result.outcomes}, f, indent=1)


if __name__ == "__main__":
    main()
