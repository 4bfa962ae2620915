"""The training fast path computes exactly what the reference formulation does.

- ``readout_loss_sums`` (CE = logsumexp − target logit from the factors, accuracy as "the target's
  logit is the row maximum") equals ``window_loss_sums(forward(...))`` in value and gradient.
- ``trim_padding`` cuts only all-PAD trailing columns, and the rank-4 loss on the cut windows is the
  full-width loss, in value and gradient.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rank4jax.data.windows import trim_padding
from rank4jax.models import rank4
from rank4jax.models.family import RANK4
from rank4jax.models.rank4.codes import target_logits
from tests.helpers import max_leaf_diff, numpy_params, ragged_windows, rank4_cfg


def _cfg(**kw):
    return rank4_cfg(**(dict(vocab_size=30, n_tokens=7, n_slices=3, dx=3, dt=2) | kw))


def _windows(cfg, batch=4, seed=0):
    """Random windows with ragged PAD tails; column 6 is PAD everywhere, window 1 ends at column 3."""
    w = ragged_windows(cfg, batch, seed, lengths=(2, cfg.n_tokens - 1))
    w[1, :, 3:] = 0
    return w


def _reference_objective(params, windows, cfg):
    sums = rank4.window_loss_sums(rank4.forward(params, windows[:, :-1], cfg), windows[:, 1:])
    return sums["window_ce_sum"] / sums["window_tokens"], sums


def _objective_and_sums(params, windows, cfg):
    sums = RANK4.loss_sums(params, windows, cfg)
    return sums["objective"], sums


def _sums_and_grad(objective):
    """``objective(p) -> (value, sums)`` → jitted ``p -> ((value, sums), grad)``: one program for the
    sums and the gradient (eager, every primitive would compile on its own)."""
    return jax.jit(jax.value_and_grad(objective, has_aux=True))


def test_target_logits_equal_the_logits_entry():
    with jax.enable_x64(True):
        cfg = _cfg()
        params = numpy_params(rank4.init_params, cfg, jnp.float64, seed=1)  # nothing to compile
        y = jnp.asarray(np.random.default_rng(2).standard_normal((2, 5, cfg.width)))
        tgt = jnp.array([[0, 3, 29, 7, 7], [1, 2, 3, 4, 5]])
        sem, tmp = params["embed"]["sem"], params["readout"]["tmp"]
        logits = rank4.codes.apply_readout(sem, tmp, y)
        expected = jnp.take_along_axis(logits, tgt[..., None], axis=-1)[..., 0]
        np.testing.assert_allclose(target_logits(sem, tmp, y, tgt), expected, rtol=0, atol=1e-13)


def test_readout_loss_sums_match_window_loss_sums_and_gradients():
    with jax.enable_x64(True):
        cfg = _cfg()
        params = numpy_params(rank4.init_params, cfg, jnp.float64, seed=7)  # 3 tokens predicted right
        windows = jnp.asarray(_windows(cfg))
        (_, ref), g_ref = _sums_and_grad(lambda p: _reference_objective(p, windows, cfg))(params)
        (_, fast), g_fast = _sums_and_grad(lambda p: _objective_and_sums(p, windows, cfg))(params)
        for key, value in ref.items():
            np.testing.assert_allclose(float(fast[key]), float(value), rtol=1e-12, atol=1e-12, err_msg=key)
        assert float(ref["correct_tokens"]) > 0  # the accuracy comparison is not vacuous
        assert max_leaf_diff(g_ref, g_fast) < 1e-12


def test_trim_padding_cuts_only_all_pad_columns():
    cfg = _cfg()
    w = _windows(cfg)
    used = int(np.flatnonzero(np.any(w != 0, axis=(0, 1)))[-1]) + 1
    assert used < cfg.n_tokens
    cut = trim_padding(w)
    assert cut.shape == (4, cfg.n_slices + 1, used)
    np.testing.assert_array_equal(cut, w[:, :, :used])
    assert not np.any(w[:, :, used:])
    assert trim_padding(w, multiple=4).shape[2] == min(cfg.n_tokens, -(-used // 4) * 4)
    assert trim_padding(w, multiple=100).shape[2] == cfg.n_tokens  # never wider than N


def test_trim_padding_keeps_windows_without_input_tokens_whole():
    cfg = _cfg()
    w = _windows(cfg)
    w[2, :-1] = 0  # window 2 has no input token: its queries attend to nothing
    assert trim_padding(w).shape == w.shape
    assert trim_padding(np.zeros_like(w)).shape == w.shape
    with pytest.raises(ValueError, match="multiple"):
        trim_padding(w, multiple=0)


def test_loss_on_trimmed_windows_equals_full_width_loss():
    with jax.enable_x64(True):
        cfg = _cfg()
        params = numpy_params(rank4.init_params, cfg, jnp.float64, seed=3)
        w = _windows(cfg)
        cut = trim_padding(w)
        assert cut.shape[2] < w.shape[2]
        (_, full), g_full = _sums_and_grad(lambda p: _objective_and_sums(p, jnp.asarray(w), cfg))(params)
        (_, trimmed), g_cut = _sums_and_grad(lambda p: _objective_and_sums(p, jnp.asarray(cut), cfg))(params)
        for key, value in full.items():
            np.testing.assert_allclose(float(trimmed[key]), float(value), rtol=1e-12, err_msg=key)
        assert max_leaf_diff(g_full, g_cut) < 1e-12
        with pytest.raises(ValueError, match="more than n_tokens"):
            RANK4.loss_sums(params, jnp.zeros((1, cfg.n_slices + 1, cfg.n_tokens + 1), jnp.int32), cfg)
