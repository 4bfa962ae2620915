"""Canonical export/import (SPEC §10) and config validation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rank4jax
from rank4jax.errors import ConfigError, DataError
from tests.helpers import numpy_params


def small_cfg():  # parameters below: tests.helpers.numpy_params (the jax init compiles a program per shape)
    return rank4jax.Rank4Config(vocab_size=11, n_tokens=3, n_slices=2, dx=2, dt=3, n_heads=2, n_layers=2)


def test_export_names_shapes_and_exact_round_trip():
    cfg = small_cfg()
    params = numpy_params(rank4jax.init_params, cfg)
    flat = rank4jax.export_params(params, cfg)
    assert flat["layers.1.attn.wq"].shape == (2, 2, 3, 2, 3)
    assert flat["layers.0.mlp.w1"].shape == (6, 24) and flat["final_ln.bias"].shape == (2, 3)
    assert all(v.dtype == np.float32 for v in flat.values())
    assert len(flat) == 3 + 11 * 2 + 2
    back = rank4jax.import_params(flat, cfg)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), params, back)
    again = rank4jax.export_params(back, cfg)
    for name in flat:
        np.testing.assert_array_equal(flat[name], again[name])


def test_export_attention_layout_input_fiber_first():
    """wq[h, n_in, q_in, n_out, q_out] multiplies U[n_in, q_in] into Q[n_out, q_out]."""
    cfg = small_cfg()
    params = numpy_params(rank4jax.init_params, cfg, seed=1)
    flat = rank4jax.export_params(params, cfg)
    u = np.random.default_rng(0).normal(size=(2, 3)).astype(np.float32)
    q_canonical = np.einsum("nq,nqmr->mr", u, flat["layers.0.attn.wq"][1])
    q_internal = (u.reshape(6) @ np.asarray(params["layers"][0]["attn"]["wq"][1])).reshape(2, 3)
    np.testing.assert_allclose(q_canonical, q_internal, rtol=1e-5, atol=1e-6)


def test_import_rejects_missing_unexpected_and_misshaped():
    cfg = small_cfg()
    flat = rank4jax.export_params(numpy_params(rank4jax.init_params, cfg), cfg)
    missing = dict(flat)
    del missing["layers.1.mlp.b2"]
    with pytest.raises(DataError, match="missing array 'layers.1.mlp.b2'"):
        rank4jax.import_params(missing, cfg)
    bad = dict(flat, **{"embed.tmp": np.zeros((11, 4), np.float32)})
    with pytest.raises(DataError, match=r"'embed.tmp' has shape \(11, 4\), expected \(11, 3\)"):
        rank4jax.import_params(bad, cfg)
    extra = dict(flat, **{"layers.2.mlp.b2": np.zeros(6, np.float32)})
    with pytest.raises(DataError, match="unexpected array 'layers.2.mlp.b2'"):
        rank4jax.import_params(extra, cfg)


def test_import_float64():
    cfg = small_cfg()
    flat = rank4jax.export_params(numpy_params(rank4jax.init_params, cfg), cfg)
    with jax.enable_x64(True):
        params = rank4jax.import_params(flat, cfg, dtype=jnp.float64)
        assert params["layers"][0]["attn"]["wk"].dtype == jnp.float64


@pytest.mark.parametrize(
    "field,value",
    [("vocab_size", 0), ("n_tokens", -1), ("dx", 2.5), ("n_heads", True), ("n_layers", "2"), ("dt", None)],
)
def test_config_rejects_non_positive_integer_sizes(field, value):
    kw = dict(vocab_size=11, n_tokens=3, n_slices=2, dx=2, dt=3, n_heads=2, n_layers=2) | {field: value}
    with pytest.raises(ConfigError, match=field):
        rank4jax.Rank4Config(**kw)


@pytest.mark.parametrize("rate", [-0.1, 1.0, 1.5])
def test_config_rejects_bad_dropout(rate):
    with pytest.raises(ConfigError, match="dropout"):
        rank4jax.Rank4Config(11, 3, 2, 2, 3, 2, 2, dropout=rate)


def test_config_is_hashable_and_rejects_unknown_attention():
    cfg = small_cfg()
    assert hash(cfg) == hash(small_cfg())
    with pytest.raises(ConfigError, match="attention"):
        rank4jax.Rank4Config(11, 3, 2, 2, 3, 2, 2, attention="softmax2")
