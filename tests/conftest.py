"""Test setup: two simulated CPU devices (set before jax initialises its backend) compiling at XLA's
CPU optimisation level 0 with its classic elemental emitters, a JAX persistent compilation cache kept
between test sessions, and tiny trained runs shared by the tests that only read them
(session-scoped: one per xdist worker).

Most of the suite's time is JAX tracing and XLA compiling distinct programs. Level 0 compiles
about half as long as level 1 (a tiny rank-4 train step 1.3 → 0.6 s; the whole suite on an empty cache 4 min 40 s
→ 3 min 10 s, 2026-12-03), and level 1 a quarter less than the product's default level 2; the
classic emitters (``--xla_cpu_use_fusion_emitters=false``) take about 30 % off again. Float64 results
move by an ulp at most (1e-15). Float32 ops run one by one, as jax.random's draws outside jit are,
can move by a float32 ulp (1.2e-7) between level 0 and the others: the float64 reference fixture's
initial parameters are drawn in a child at level 1 (``tests/test_reference_outputs.py``), and every
comparison between two runs compares programs compiled alike.

The compilation cache is a directory of XLA executables keyed by the program, the compile options,
XLA's flags and the jax/jaxlib versions (a stale entry is never used): the many tests that build the
same tiny programs (and the CLI subprocesses, which inherit the environment) compile them once per
session, and a rerun of ``make test`` loads every program no change touched. It is kept in
``.jax-test-cache/`` (git-ignored, machine-local) under JAX's own size limit (least recently used
entries go first); ``RANK4JAX_TEST_CACHE=fresh`` runs on an empty cache removed at the end (what
CI's clean checkout gets anyway); ``RANK4JAX_TEST_CACHE=<dir>`` keeps one elsewhere.
"""

import os
import pathlib
import shutil
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
# XLA's CPU backend at optimisation level 0 (the product's default is 2) with its classic elemental
# emitters: about a third of the compile time of the product's settings for the suite, which is nearly
# all compiling (the module docstring says what moves). The command lines run on one CPU device, as a
# user runs them.
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
SUBPROCESS_XLA_FLAGS = TEST_XLA_FLAGS
os.environ["XLA_FLAGS"] = " ".join(
    [os.environ.get("XLA_FLAGS", ""), TEST_XLA_FLAGS, "--xla_force_host_platform_device_count=2"]
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
KEPT_CACHE = REPO / ".jax-test-cache"
KEPT_CACHE_MAX_BYTES = 512 * 2**20  # JAX's own LRU limit; a full session writes about 25 MB
_CHOICE = "RANK4JAX_TEST_CACHE"  # unset: KEPT_CACHE; "fresh": an empty cache removed at the end; or a dir
_OWNER = "RANK4JAX_TEST_CACHE_OWNER"  # the pid of the process that set the cache up (this file may be
# imported twice in it: as pytest's conftest and as tests.conftest by the test modules)


def _session_cache() -> str:
    """The cache directory for this session (the controller's choice; workers and subprocesses inherit it)."""
    choice = os.environ.get(_CHOICE) or str(KEPT_CACHE)
    if choice == "fresh":
        return tempfile.mkdtemp(prefix="rank4jax-test-jax-cache-")
    os.makedirs(choice, exist_ok=True)
    return choice


if "PYTEST_XDIST_WORKER" not in os.environ and os.environ.get(_OWNER) != str(os.getpid()):
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _session_cache()
    os.environ[_OWNER] = str(os.getpid())  # the controller (or a run without xdist); workers inherit
os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"] = str(KEPT_CACHE_MAX_BYTES)
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.1"  # not the many tiny eager-op programs
os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "-1"

import pytest  # noqa: E402

SHARED_CLOZE = REPO.parent / "shared" / "data" / "storycloze_val_2016.csv"


def pytest_sessionfinish(session, exitstatus):
    """A fresh cache is removed by the process that made it."""
    owner = "PYTEST_XDIST_WORKER" not in os.environ and os.environ.get(_OWNER) == str(os.getpid())
    if owner and os.environ.get(_CHOICE) == "fresh":
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
    train(tiny_config(plots=True), str(workdir))  # with its curves (test_plot_command redraws them)
    return workdir


@pytest.fixture(scope="session")
def tiny_baseline_run(tmp_path_factory):
    """A finished tiny free-running baseline run (the same windows as ``tiny_run``)."""
    from rank4jax.training.loop import train
    from tests.helpers import tiny_config

    workdir = tmp_path_factory.mktemp("tiny_baseline_run")
    train(tiny_config(model_family="baseline"), str(workdir))
    return workdir


@pytest.fixture
def tiny_run_copy(tiny_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(tiny_run, copy)
    return copy
