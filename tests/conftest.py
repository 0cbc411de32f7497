import os
import secrets

import numpy as np
import pytest


@pytest.fixture(autouse=True, scope="session")
def conv_choices_of_this_session(tmp_path_factory):
    """The cpu backend keeps its measured conv kernels in a file per user (convtune.py); the
    suite keeps its own, shared by its subprocesses, so no test reads what an earlier run of
    the user's left there."""
    old = os.environ.get("NPURUN_CONV_TUNE_FILE")
    os.environ["NPURUN_CONV_TUNE_FILE"] = str(tmp_path_factory.mktemp("convtune") / "convtune.json")
    yield
    if old is None:
        os.environ.pop("NPURUN_CONV_TUNE_FILE", None)
    else:
        os.environ["NPURUN_CONV_TUNE_FILE"] = old


@pytest.fixture
def rng(request):
    """A fresh random generator per test; the seed is printed so a failure can be replayed
    (NPURUN_TEST_SEED=<seed> pytest ...)."""
    seed = int(os.environ.get("NPURUN_TEST_SEED") or secrets.randbits(32))
    print(f"seed={seed}")
    return np.random.default_rng(seed)


def nonzero_normal(rng, shape, dtype=np.float32):
    """Standard-normal values pushed away from 0, so no test runs on (near-)zero inputs."""
    x = rng.standard_normal(shape)
    x = np.where(np.abs(x) < 0.05, np.sign(x + 1e-12) * 0.05 + x, x)
    return x.astype(dtype)


# Lines a test wants in CI's log whatever the outcome (e.g. the conformance figure).
SUMMARY: list[str] = []


def pytest_terminal_summary(terminalreporter):
    for line in SUMMARY:
        terminalreporter.write_line(line)
