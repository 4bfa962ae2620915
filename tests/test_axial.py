"""Axial attention (``model.attention_grid="axial"``, an ablation of the joint softmax): within each
slice, then across the slices at each token position, with the joint block's own maps. Exact values
by hand on a tiny grid, the equality with the joint block where the two must agree (T = 1, N = 1),
the difference where they must not, the compact layout equal to the windows layout, and a run end to
end."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rank4jax
from rank4jax.errors import ConfigError
from rank4jax.models.rank4.attention import joint_heads
from rank4jax.models.rank4.axial import axial_heads
from rank4jax.runs import load_run
from rank4jax.training.loop import train
from tests.helpers import jitted_forward, numpy_params, rank4_cfg, tiny_config

# jitted once (eagerly, every primitive of a forward compiles as its own program)
_axial_heads = jax.jit(axial_heads, static_argnames="n_slices")
_joint_heads = jax.jit(joint_heads)


def _softmax(s, keep):
    s = np.where(keep, s, -np.inf)
    e = np.exp(s - s.max())
    return e / e.sum()


def _by_hand(params, u, mask, n_slices):
    """Σ_h A^T_h A^N_h V_h with loops over every query and key (float64)."""
    batch, n_positions, width = u.shape
    n_tokens, out = n_positions // n_slices, np.zeros_like(u)
    for h in range(params["wq"].shape[0]):
        q, k, v = (u @ params[name][h] for name in ("wq", "wk", "wv"))
        for b in range(batch):
            for x in range(n_tokens):
                for t in range(n_slices):
                    p = x * n_slices + t
                    has_token = [any(mask[b, y * n_slices + s] for y in range(n_tokens)) for s in range(n_slices)]
                    keys = [mask[b, x * n_slices + s] or (s == t and has_token[t]) for s in range(n_slices)]
                    if not any(keys):  # the cells at x holding a token and the query's own (its slice has one)
                        continue
                    hop_t = _softmax(
                        np.array([q[b, p] @ k[b, x * n_slices + s] for s in range(n_slices)]) / np.sqrt(width),
                        np.array(keys),
                    )
                    for s in range(n_slices):
                        if not has_token[s]:  # a slice with no token gives nothing
                            continue
                        cell = x * n_slices + s  # (x, s): its within-slice average over the slice s
                        hop_n = _softmax(
                            np.array([q[b, cell] @ k[b, y * n_slices + s] for y in range(n_tokens)]) / np.sqrt(width),
                            np.array([mask[b, y * n_slices + s] for y in range(n_tokens)]),
                        )
                        within = sum(hop_n[y] * v[b, y * n_slices + s] for y in range(n_tokens))
                        out[b, p] += hop_t[s] * within
    return out


def _case(n_tokens, n_slices, seed=0, width=6, heads=2):
    rng = np.random.default_rng(seed)
    params = {name: rng.normal(size=(heads, width, width)) / 3 for name in ("wq", "wk", "wv")}
    u = rng.normal(size=(2, n_tokens * n_slices, width))
    mask = rng.random((2, n_tokens * n_slices)) > 0.3
    mask[:, 0] = True  # every window has a token
    return params, u, mask


def _case_with_an_empty_slice():
    """A 3 × 3 grid whose window 0 has no token in slice 1 and window 1 none at x = 2."""
    params, u, mask = _case(3, 3, seed=4)
    mask[0, 1::3], mask[1, 6:] = False, False
    mask[1, :6] = True
    return params, u, mask


@pytest.mark.parametrize("case", [lambda: _case(3, 2), _case_with_an_empty_slice], ids=["3x2", "empty-slice"])
def test_axial_attention_by_hand(case):
    """Every output of a grid with PAD keys (and an empty slice, and a position no slice reaches),
    against loops over the two hops (float64)."""
    params, u, mask = case()
    n_slices = u.shape[1] // 3
    with jax.enable_x64(True):
        got, heads = _axial_heads(
            jax.tree.map(jnp.asarray, params), jnp.asarray(u), jnp.asarray(mask), n_slices=n_slices
        )
        np.testing.assert_allclose(np.asarray(got), _by_hand(params, u, mask, n_slices), rtol=1e-12, atol=1e-12)
        # the two hops' product weighs the grid's tokens only, a distribution where the query's slice has a token
        weights = np.asarray(heads["weights"])
        assert np.abs(weights * ~mask[:, None, None, :]).max() == 0.0
        slice_has_token = np.repeat(mask.reshape(2, 3, n_slices).any(axis=1)[:, None, :], 3, axis=1).reshape(2, -1)
        rows = weights.sum(-1).transpose(1, 0, 2)  # (H, B, P)
        np.testing.assert_allclose(rows[:, slice_has_token], 1.0, rtol=1e-12)
        assert (rows[:, ~slice_has_token] <= 1.0 + 1e-12).all()


@pytest.mark.parametrize("grid", [(5, 1), (1, 4)], ids=["T=1", "N=1"])
def test_axial_equals_joint_where_one_hop_is_left(grid):
    """With one slice (or one token per slice) the hop left is the joint softmax: equal outputs and weights."""
    params, u, mask = _case(*grid, seed=1)
    with jax.enable_x64(True):
        params, u, mask = jax.tree.map(jnp.asarray, (params, u, mask))
        joint, joint_tensors = _joint_heads(params, u, mask)
        axial, axial_heads_ = _axial_heads(params, u, mask, n_slices=grid[1])
        np.testing.assert_allclose(np.asarray(axial), np.asarray(joint), rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(
            np.asarray(axial_heads_["weights"]), np.asarray(joint_tensors["weights"]), rtol=1e-13, atol=1e-13
        )


def test_axial_differs_from_joint_on_a_grid():
    """On a 3 × 2 grid the two-hop weights are not the joint softmax's: the outputs differ."""
    params, u, mask = _case(3, 2, seed=2)
    with jax.enable_x64(True):
        params, u, mask = jax.tree.map(jnp.asarray, (params, u, mask))
        gap = jnp.abs(_joint_heads(params, u, mask)[0] - _axial_heads(params, u, mask, n_slices=2)[0])
        assert float(gap.max()) > 1e-2


def _cfg(**kw):
    return rank4_cfg(**(dict(vocab_size=11, n_tokens=3, n_slices=2, dx=2, dt=3) | kw))


def test_the_axial_model_has_the_joint_models_parameters_and_its_T1_logits():
    """The same parameter tree; at T = 1 the axial model's logits are the joint model's (float64)."""
    with jax.enable_x64(True):
        joint_cfg, axial_cfg = _cfg(n_slices=1), _cfg(n_slices=1, attention_grid="axial")
        params = numpy_params(rank4jax.init_params, joint_cfg, jnp.float64)
        shapes = jax.eval_shape(lambda key: rank4jax.init_params(key, axial_cfg), jax.random.key(0))
        assert jax.tree.map(jnp.shape, params) == jax.tree.map(jnp.shape, shapes)
        inputs = np.random.default_rng(3).integers(0, 11, (4, 1, 3)).astype(np.int32)
        np.testing.assert_allclose(
            np.asarray(jitted_forward(params, inputs, axial_cfg)),
            np.asarray(jitted_forward(params, inputs, joint_cfg)),
            rtol=1e-12,
            atol=1e-12,
        )


def test_axial_is_refused_with_the_analytic_backward_or_a_score_variant():
    with pytest.raises(ConfigError, match="attention_grid must be one of"):
        _cfg(attention_grid="diagonal")
    with pytest.raises(ConfigError, match="axial attention runs with attention='autodiff'"):
        _cfg(attention_grid="axial", attention="analytic")


def test_an_axial_run_trains_and_loads(tmp_path):
    """A tiny axial run end to end (compact batches, the trainer's default layout) loads as axial."""
    summary = train(tiny_config(**{"model.attention_grid": "axial"}), str(tmp_path))
    run = load_run(str(tmp_path))
    assert summary["step"] == 6 and run.model_cfg.attention_grid == "axial"
