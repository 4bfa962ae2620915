"""The §6 analytic backward (custom VJP) against jax.grad / jax.vjp."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rank4jax
from rank4jax.models.common import layer_norm
from rank4jax.models.rank4.analytic import attention_block
from rank4jax.models.rank4.attention import joint_heads
from rank4jax.models.rank4.model import key_padding_mask
from tests.helpers import numpy_params

PAD = 0


def random_inputs(seed, batch, n_slices, n_tokens, vocab, pad):
    """(B, T, N) tokens; with ``pad``: ragged PAD tails, one PAD-only sentence, one all-PAD window."""
    tokens = np.random.default_rng(seed).integers(4, vocab, (batch, n_slices, n_tokens)).astype(np.int32)
    if pad:
        rng = np.random.default_rng(0)
        for b in range(batch):
            for t in range(n_slices):
                tokens[b, t, rng.integers(1, n_tokens + 1) :] = PAD
        tokens[0, -1, :] = PAD  # a PAD-only sentence
        tokens[-1] = PAD  # every key PAD: its queries get zero weights
    return jnp.asarray(tokens)


def perturbed_params(cfg, dtype, seed=0):
    """Random params with non-trivial LayerNorm affines and biases, so every gradient path is exercised
    (drawn with numpy: nothing to compile)."""
    return numpy_params(rank4jax.init_params, cfg, dtype, seed)


def max_relative_error(got, want) -> float:
    """max |got − want| / max |want| over a leaf (the leaf's own scale)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-300))


def worst_error(tree_a, tree_b) -> float:
    errs = jax.tree_util.tree_map(max_relative_error, tree_a, tree_b)
    return max(jax.tree_util.tree_leaves(errs))


CASES = [  # (H, T, N, dx, dt, pad)
    (1, 1, 1, 2, 2, False),
    (3, 4, 5, 3, 5, True),
    (1, 4, 5, 5, 3, True),
    (3, 1, 5, 3, 2, True),
    (3, 4, 1, 2, 3, True),
    (1, 4, 5, 4, 4, False),
]


def _single_layer_grads(case, dtype):
    heads, n_slices, n_tokens, dx, dt, pad = case
    cfg = rank4jax.Rank4Config(13, n_tokens, n_slices, dx, dt, heads, 1, dropout=0.0)
    layer = perturbed_params(cfg, dtype)["layers"][0]
    inputs = random_inputs(7, 3, n_slices, n_tokens, 13, pad)
    mask = key_padding_mask(inputs)
    x = jnp.asarray(np.random.default_rng(8).standard_normal((3, n_tokens * n_slices, dx * dt)), dtype)
    cot = jnp.asarray(np.random.default_rng(9).standard_normal(x.shape), dtype)

    def autodiff(x, ln, attn):
        return joint_heads(attn, layer_norm(x, ln["scale"], ln["bias"]), mask)[0]

    def analytic(x, ln, attn):
        return attention_block(x, ln, attn, mask)

    def output_and_grad(f):  # one program per side, compiled apart (no common subexpressions shared);
        # eager, each primitive would compile on its own (~160 programs per case)
        def run(x, ln, attn, cot):
            out, vjp = jax.vjp(f, x, ln, attn)
            return out, vjp(cot)

        return jax.jit(run)(x, layer["ln_attn"], layer["attn"], cot)

    (out_a, got), (out_b, want) = output_and_grad(analytic), output_and_grad(autodiff)
    np.testing.assert_array_equal(np.asarray(out_a), np.asarray(out_b))
    return got, want


@pytest.mark.parametrize("case", CASES)
def test_single_layer_float64(case):
    with jax.enable_x64(True):
        got, want = _single_layer_grads(case, jnp.float64)
        assert worst_error(got, want) <= 1e-10


@pytest.mark.parametrize("case", CASES[1:3])
def test_single_layer_float32(case):
    got, want = _single_layer_grads(case, jnp.float32)
    assert worst_error(got, want) <= 1e-4


def _model_grads(case, dtype):
    heads, n_slices, n_tokens, dx, dt, pad = case
    cfg = rank4jax.Rank4Config(17, n_tokens, n_slices, dx, dt, heads, 2, dropout=0.0)
    params = perturbed_params(cfg, dtype, seed=3)
    windows = random_inputs(11, 4, n_slices + 1, n_tokens, 17, pad)

    def loss(p, c):
        return rank4jax.window_losses(rank4jax.forward(p, windows[:, :-1], c), windows[:, 1:])["window_ce"]

    analytic_cfg = dataclasses.replace(cfg, attention="analytic")
    value_and_grad = jax.jit(jax.value_and_grad(loss), static_argnums=1)  # a program per mode
    (value_a, got), (value_b, want) = value_and_grad(params, analytic_cfg), value_and_grad(params, cfg)
    assert float(value_a) == float(value_b)
    return got, want


@pytest.mark.parametrize("case", [CASES[1], CASES[3], CASES[4]])
def test_two_layer_model_loss_float64(case):
    with jax.enable_x64(True):
        got, want = _model_grads(case, jnp.float64)
        assert worst_error(got, want) <= 1e-10


def test_two_layer_model_loss_float32():
    got, want = _model_grads(CASES[1], jnp.float32)
    assert worst_error(got, want) <= 1e-4


def test_error_metric_can_fail():
    """The comparison is sensitive: a 1e-6 relative perturbation of one entry is detected."""
    with jax.enable_x64(True):
        got, want = _single_layer_grads(CASES[1], jnp.float64)
        bumped = (got[0].at[0, 0, 0].add(1e-6 * jnp.max(jnp.abs(want[0]))),) + tuple(got[1:])
        assert worst_error(bumped, want) > 1e-7


def test_training_steps_match_between_modes(tmp_path):
    from rank4jax.training.loop import train
    from rank4jax.training.metrics import read_metrics
    from tests.helpers import tiny_config

    losses = {}  # tiny_config's model (one layer; two layers: test_two_layer_model_loss_*): the autodiff
    for mode in ("autodiff", "analytic"):  # run's programs are those every other tiny run compiles
        config = tiny_config(num_steps=4, log_every=1, **{"model.attention": mode})
        train(config, str(tmp_path / mode))
        losses[mode] = [r["loss"] for r in read_metrics(str(tmp_path / mode))["train"]]
    assert len(losses["analytic"]) == 4
    np.testing.assert_allclose(losses["analytic"], losses["autodiff"], rtol=0, atol=1e-5)
