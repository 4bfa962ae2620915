"""Test setup: two simulated CPU devices (set before jax initialises its backend), a JAX persistent
compilation cache kept between test sessions, and tiny trained runs shared by the tests that only
read them (session-scoped: one per xdist worker).

The compilation cache is a directory of XLA executables keyed by the program: the many tests that
build the same tiny train or eval step (and the CLI subprocesses, which inherit the environment)
compile it once per session (measured: tests/test_training.py and tests/test_sharding.py, 255 s →
110 s on 2 cores). XLA's -O0 backend level would halve compile times again but changed float64
results by 3e-7 (tests/test_reference_outputs.py); level 1 (the threefry kernels of dropout compile
6× faster: a (6, 18, 6) bernoulli 1.6 s → 0.25 s) still changed a train step's parameters and float64
gradients by an ulp (40 of 62 arrays of a probe differed from the default level's), so the tests
compile as the product does.

The cache is kept between sessions in ``.jax-test-cache/`` (git-ignored, machine-local): a program
that no change touched is loaded, not compiled, on the next ``make test`` (README: Tests gives the
times with an empty and a kept cache; a change to the model invalidates every program that contains
it). JAX keys each
entry by the program, the compile options, XLA's flags and the jax/jaxlib versions, so a stale entry
is never used. ``RANK4JAX_TEST_CACHE=fresh`` runs on an empty cache removed at the end (what CI's clean
checkout does anyway); ``RANK4JAX_TEST_CACHE=<dir>`` keeps one elsewhere. A failed session empties the
kept cache (removes the files JAX wrote there, nothing else), so a rerun compiles everything afresh:
JAX writes entries in place, and a process killed while writing one leaves a damaged entry that later
reads skip with a warning and never replace. A cache grown past KEPT_CACHE_LIMIT is emptied before a
session starts.
"""

import os
import pathlib
import shutil
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
SUBPROCESS_XLA_FLAGS = ""  # one CPU device: the command lines run as a user runs them
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
KEPT_CACHE = REPO / ".jax-test-cache"
KEPT_CACHE_LIMIT = 512 * 2**20  # bytes; a full session adds about 25 MB (about 450 entries)
_CHOICE = "RANK4JAX_TEST_CACHE"  # unset: KEPT_CACHE; "fresh": an empty cache removed at the end; or a dir
_OWNER = "RANK4JAX_TEST_CACHE_OWNER"  # the pid of the process that set the cache up (this file may be
# imported twice in it: as pytest's conftest and as tests.conftest by the test modules)


def _entries(path: str) -> list[os.DirEntry]:
    """The files JAX's cache wrote in ``path`` (nothing else there is touched)."""
    with os.scandir(path) as entries:
        return [e for e in entries if e.is_file() and e.name.endswith(("-cache", "-atime"))]


def _empty(path: str) -> None:
    for entry in _entries(path):
        os.remove(entry.path)


def _session_cache() -> str:
    """The cache directory for this session (the controller's choice; workers and subprocesses inherit it)."""
    choice = os.environ.get(_CHOICE) or str(KEPT_CACHE)
    if choice == "fresh":
        return tempfile.mkdtemp(prefix="rank4jax-test-jax-cache-")
    if os.path.isdir(choice) and sum(e.stat().st_size for e in _entries(choice)) > KEPT_CACHE_LIMIT:
        _empty(choice)  # start afresh rather than grow without bound
    os.makedirs(choice, exist_ok=True)
    return choice


if "PYTEST_XDIST_WORKER" not in os.environ and os.environ.get(_OWNER) != str(os.getpid()):
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _session_cache()
    os.environ[_OWNER] = str(os.getpid())  # the controller (or a run without xdist); workers inherit
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.1"  # not the many tiny eager-op programs
os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "-1"

import pytest  # noqa: E402

SHARED_CLOZE = REPO.parent / "shared" / "data" / "storycloze_val_2016.csv"


def _close_cache(cache: str, exitstatus: int) -> None:
    """A fresh cache is removed; a kept one is emptied after a failed session."""
    if os.environ.get(_CHOICE) == "fresh":
        shutil.rmtree(cache, ignore_errors=True)
    elif exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED) and os.path.isdir(cache):
        _empty(cache)


def pytest_sessionfinish(session, exitstatus):
    if "PYTEST_XDIST_WORKER" not in os.environ and os.environ.get(_OWNER) == str(os.getpid()):
        _close_cache(os.environ["JAX_COMPILATION_CACHE_DIR"], exitstatus)  # the controller's


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
