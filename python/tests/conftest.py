"""The Python package's tests (make test-python): the goldens the C suites check,
through the package's API. Data: $GEMMA4_DATA, else the repository's data/.

Tolerances are the C suites' (each test file's top comment says which):
  logits and layer outputs: max |ours - ref| <= 2e-5 * max |ref|  (tests/test_gemma4.c)
  taps against a dump: 1e-4 float32, 3e-2 bf16 (examples/compare.h, `gemma4 compare`)
  loss: 1e-5 relative; gradients: 1e-4 * max |ref| per tensor       (tests/test_train.c)
"""

import os

import numpy as np
import pytest

import gemma4
from gemma4 import safetensors as st

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.environ.get("GEMMA4_DATA") or os.path.join(REPO, "data")
TINY = ["e2b_like", "e4b_like", "31b_like", "26b_like", "legacy_keys", "plain", "ple_wide"]
TOL = 2e-5


def tiny(name):
    return os.path.join(DATA, "tiny", name)


def golden(model, file="golden.safetensors"):
    return st.load(os.path.join(tiny(model), file))[0]


def rel(ours, ref):
    """max |ours - ref| / max |ref| (a NaN anywhere is inf)."""
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    assert ours.shape == ref.shape, f"shape {ours.shape} vs {ref.shape}"
    d = np.abs(ours - ref)
    if np.isnan(d).any():
        return np.inf
    return float(d.max() / max(np.abs(ref).max(), 1e-30))


_models = {}


@pytest.fixture(scope="session")
def model():
    """model(name) -> a cached gemma4.Model of data/tiny/<name> (2 threads)."""
    def get(name, adapter=None):
        key = (name, adapter)
        if key not in _models:
            _models[key] = gemma4.Model(tiny(name), adapter=adapter, threads=2)
        return _models[key]
    return get


_counts = {}


def pytest_terminal_summary(terminalreporter):
    """The harness's closing line (tests/harness.h), for make test's total: written to
    $GEMMA4_PYTEST_SUMMARY when set (python/tests/run.sh prints it last)."""
    s = terminalreporter.stats
    p, f = len(s.get("passed", [])), len(s.get("failed", [])) + len(s.get("error", []))
    k = len(s.get("skipped", []))
    line = f"{p} passed, {f} failed" + (f", {k} skipped" if k else "")
    out = os.environ.get("GEMMA4_PYTEST_SUMMARY")
    if out:
        with open(out, "w") as fh:
            fh.write(line + "\n")
