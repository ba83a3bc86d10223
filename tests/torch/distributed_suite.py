"""PyTorch's own distributed test suite (torch/testing/_internal/distributed/distributed_test.py,
shipped with python3-torch) run against the plexus backend, the way test_distributed_spawn.py
runs it for gloo: BACKEND and WORLD_SIZE in the environment, one spawned process per rank and
test.

    PYTHONPATH=build/python python3 tests/torch/distributed_suite.py [-k pattern]... [--summary F]
        [--require-passed N]

The backend is declared a plugin (and DDP/subgroup capable) to torch's test helpers; tests gated
on gloo or nccl, or on GPUs, are skipped by the suite itself with its reason. Prints counts of
tests run, passed, failed and skipped (by reason); exits 1 on any failure, 77 without torch.
"""

import collections
import importlib.abc
import importlib.machinery
import json
import os
import sys
import unittest

os.environ.setdefault("BACKEND", "plexus")
os.environ.setdefault("WORLD_SIZE", "2")

_HERE = os.path.dirname(os.path.abspath(__file__))


class _ShardMetadataFix(importlib.abc.MetaPathFinder):
    """Debian's torch 1.13 under Python 3.11: torch.distributed._shard's metadata dataclass has a
    mutable default (an instance), which 3.11 refuses; DDP's tests import it. Load that one module
    with default_factory instead, in memory (the installed file is left alone)."""

    NAME = "torch.distributed._shard.sharded_tensor.metadata"

    def find_spec(self, fullname, path, target=None):
        if fullname != self.NAME:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.origin is None:
            return None

        class Loader(importlib.machinery.SourceFileLoader):
            def get_code(self, name):
                src = self.get_data(self.path).replace(
                    b"field(default=TensorProperties())", b"field(default_factory=TensorProperties)")
                return compile(src, self.path, "exec", dont_inherit=True)

        spec.loader = Loader(fullname, spec.origin)
        return spec


sys.meta_path.insert(0, _ShardMetadataFix())
try:
    import expecttest  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(_HERE, "support"))

try:
    import torch
    import torch.distributed as dist  # noqa: F401
except ImportError as e:
    print(f"skipped: torch is not importable by {sys.executable}: {e}")
    sys.exit(77)

import plexus_torch  # noqa: F401,E402  (registers the backend)
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

if os.environ["BACKEND"] == "plexus":
    # What the plexus backend supports, in the suite's vocabulary ("cuda"/"gpu" stay out: CPU).
    for feature in ("plugin", "ddp", "subgroup"):
        DistTestCases.backend_feature[feature].add("plexus")

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)


# Tests of features the backend refuses by design, with the reason (none at present).
PLEXUS_UNSUPPORTED = {}


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        if os.environ["BACKEND"] == "plexus" and self._testMethodName in PLEXUS_UNSUPPORTED:
            raise unittest.SkipTest(PLEXUS_UNSUPPORTED[self._testMethodName])
        super().setUp()
        self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()


class _Result(unittest.TextTestResult):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.passed = []

    def addSuccess(self, test):  # noqa: N802
        super().addSuccess(test)
        self.passed.append(test)


def main():
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("-k", action="append", default=[], help="run tests whose name contains this")
    parser.add_argument("--summary", help="write the counts as JSON to this file")
    parser.add_argument("-v", action="store_true")
    parser.add_argument("--require-passed", type=int, default=0,
                        help="fail unless at least this many tests passed (a subset that the "
                             "suite skips entirely must not pass)")
    args = parser.parse_args()
    loader = unittest.TestLoader()
    if args.k:
        loader.testNamePatterns = [f"*{k}*" for k in args.k]
    suite = loader.loadTestsFromTestCase(TestDistBackendWithSpawn)
    runner = unittest.TextTestRunner(resultclass=_Result, verbosity=2 if args.v else 1, stream=sys.stdout)
    result = runner.run(suite)
    reasons = collections.Counter(reason.splitlines()[0][:120] for _, reason in result.skipped)
    summary = {
        "backend": os.environ["BACKEND"],
        "world_size": int(os.environ["WORLD_SIZE"]),
        "torch": torch.__version__,
        "run": result.testsRun,
        "passed": len(result.passed),
        "failed": len(result.failures) + len(result.errors),
        "skipped": len(result.skipped),
        "expected_failures": len(result.expectedFailures),
        "skip_reasons": dict(reasons.most_common()),
        "failures": sorted(t.id().split(".")[-1] for t, _ in result.failures + result.errors),
    }
    print(json.dumps(summary, indent=1))
    if args.summary:
        with open(args.summary, "w") as f:
            json.dump(summary, f, indent=1)
    if len(result.passed) < args.require_passed:
        print(f"only {len(result.passed)} tests passed, {args.require_passed} required",
              file=sys.stderr)
        return 1
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
