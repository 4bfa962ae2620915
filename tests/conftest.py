"""Test setup: two simulated CPU devices (set before jax initialises its backend), one fresh JAX
persistent compilation cache per test session, and tiny trained runs shared by the tests that only
read them (session-scoped: one per xdist worker).

The compilation cache is a directory of XLA executables keyed by the program: the many tests that
build the same tiny train or eval step (and the CLI subprocesses, which inherit the environment)
compile it once per session (measured: tests/test_training.py and tests/test_sharding.py, 255 s →
110 s on 2 cores). XLA's -O0 backend level would halve compile times again but changed float64
results by 3e-7 (tests/test_reference_outputs.py); level 1 (the threefry kernels of dropout compile
6× faster: a (6, 18, 6) bernoulli 1.6 s → 0.25 s) still changed a train step's parameters and float64
gradients by an ulp (40 of 62 arrays of a probe differed from the default level's), so the tests
compile as the product does. The cache starts empty every session, so a CI run and a local run time
the same work, and is removed at the end.
"""

import os
import shutil
import tempfile

SUBPROCESS_XLA_FLAGS = ""  # one CPU device: the command lines run as a user runs them
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
_OWNER = "RANK4JAX_TEST_CACHE_OWNER"  # the pid of the process that made the cache (this file may be
# imported twice in it: as pytest's conftest and as tests.conftest by the test modules)
if "PYTEST_XDIST_WORKER" not in os.environ and os.environ.get(_OWNER) != str(os.getpid()):
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="rank4jax-test-jax-cache-")
    os.environ[_OWNER] = str(os.getpid())  # the controller (or a run without xdist); workers inherit
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.1"  # not the many tiny eager-op programs
os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "-1"

import pathlib  # noqa: E402

import pytest  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED_CLOZE = REPO.parent / "shared" / "data" / "storycloze_val_2016.csv"


def pytest_sessionfinish(session, exitstatus):
    if "PYTEST_XDIST_WORKER" not in os.environ and os.environ.get(_OWNER) == str(os.getpid()):
        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)


@pytest.fixture
def cloze_path():
    if not SHARED_CLOZE.is_file():
        pytest.skip(f"shared Story Cloze data not found at {SHARED_CLOZE} (present in CI, absent on a fresh clone)")
    return str(SHARED_CLOZE)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """A finished tiny rank-4 run (tests.helpers.tiny_config: 6 steps, checkpoints at 4 and 6) for
    tests that only read it; tests that change a workdir take ``tiny_run_copy``."""
    from rank4jax.training.loop import train
    from tests.helpers import tiny_config

    workdir = tmp_path_factory.mktemp("tiny_run")
    train(tiny_config(), str(workdir))
    return workdir


@pytest.fixture
def tiny_run_copy(tiny_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(tiny_run, copy)
    return copy
