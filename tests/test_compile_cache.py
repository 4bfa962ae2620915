"""The tests' kept compilation cache (tests/conftest.py): where a session's cache is, when it is
emptied, and that emptying touches only the files JAX wrote."""

import os

import pytest

from tests import conftest


def _fill(path, names):
    path.mkdir(exist_ok=True)
    for name in names:
        (path / name).write_bytes(b"x" * 8)


JAX_FILES = ["jit_step-ab12-cache", "jit_step-ab12-atime"]


def test_a_kept_cache_is_reused_and_emptied_only_past_its_limit(tmp_path, monkeypatch):
    assert conftest.KEPT_CACHE == conftest.REPO / ".jax-test-cache"
    cache = tmp_path / "cache"
    _fill(cache, [*JAX_FILES, "notes.txt"])
    monkeypatch.setenv(conftest._CHOICE, str(cache))
    assert conftest._session_cache() == str(cache)
    assert sorted(os.listdir(cache)) == sorted([*JAX_FILES, "notes.txt"])  # within the limit: kept
    monkeypatch.setattr(conftest, "KEPT_CACHE_LIMIT", 15)  # the two JAX files hold 16 bytes
    assert conftest._session_cache() == str(cache)
    assert os.listdir(cache) == ["notes.txt"]  # emptied of JAX's files, nothing else
    default = tmp_path / "default"  # not the real one: other tests are using it
    monkeypatch.setattr(conftest, "KEPT_CACHE", default)
    monkeypatch.delenv(conftest._CHOICE)
    assert conftest._session_cache() == str(default) and default.is_dir()  # unset: the kept cache


@pytest.mark.parametrize(
    "exitstatus, kept",
    [(pytest.ExitCode.OK, True), (pytest.ExitCode.NO_TESTS_COLLECTED, True), (pytest.ExitCode.TESTS_FAILED, False),
     (pytest.ExitCode.INTERRUPTED, False), (pytest.ExitCode.USAGE_ERROR, False)],
)  # fmt: skip
def test_a_failed_session_empties_the_kept_cache(exitstatus, kept, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    _fill(cache, [*JAX_FILES, "notes.txt"])
    monkeypatch.setenv(conftest._CHOICE, str(cache))
    conftest._close_cache(str(cache), exitstatus)
    assert sorted(os.listdir(cache)) == sorted([*JAX_FILES, "notes.txt"] if kept else ["notes.txt"])


def test_a_fresh_cache_is_new_and_removed_at_the_end(monkeypatch):
    monkeypatch.setenv(conftest._CHOICE, "fresh")
    cache = conftest._session_cache()
    assert os.listdir(cache) == [] and cache != str(conftest.KEPT_CACHE)
    conftest._close_cache(cache, pytest.ExitCode.OK)
    assert not os.path.exists(cache)
