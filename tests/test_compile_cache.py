"""The tests' kept compilation cache (tests/conftest.py): where a session's cache is, and JAX's own
size limit on it."""

import os

import jax

from tests import conftest


def test_the_session_cache_is_the_kept_one_a_chosen_one_or_a_fresh_one(tmp_path, monkeypatch):
    assert conftest.KEPT_CACHE == conftest.REPO / ".jax-test-cache"
    chosen = tmp_path / "cache"
    monkeypatch.setenv(conftest._CHOICE, str(chosen))
    assert conftest._session_cache() == str(chosen) and chosen.is_dir()
    default = tmp_path / "default"  # not the real one: other tests are using it
    monkeypatch.setattr(conftest, "KEPT_CACHE", default)
    monkeypatch.delenv(conftest._CHOICE)
    assert conftest._session_cache() == str(default) and default.is_dir()  # unset: the kept cache
    monkeypatch.setenv(conftest._CHOICE, "fresh")
    fresh = conftest._session_cache()
    assert os.listdir(fresh) == [] and fresh not in (str(default), str(chosen))
    os.rmdir(fresh)


def test_jax_keeps_the_cache_within_its_own_limit():
    assert jax.config.jax_compilation_cache_max_size == conftest.KEPT_CACHE_MAX_BYTES == 512 * 2**20
    assert jax.config.jax_compilation_cache_dir == os.environ["JAX_COMPILATION_CACHE_DIR"]
