"""Compact batches: only the positions whose input or target is not PAD are computed.

- ``compact_windows`` keeps exactly those positions (a window without input tokens whole), puts the
  rows with a target first, and its ``grid`` / ``slot`` maps are inverse;
- the rank-4 loss on a compact batch equals the full-width loss in value and gradient, in train mode
  with dropout too, for one or several groups (float64);
- a training run with compaction matches one without, step for step.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import max_leaf_diff, numpy_params, ragged_windows, rank4_cfg, tiny_config

import rank4jax
from rank4jax.data.compact import compact_size, compact_windows
from rank4jax.engine import batches
from rank4jax.models.family import RANK4
from rank4jax.models.rank4.layout import move_rows
from rank4jax.models.scores import STANDARD
from rank4jax.models.zpx import ZPXConfig
from rank4jax.training.loop import train
from rank4jax.training.metrics import read_metrics


def _cfg(**kw):
    return rank4_cfg(**(dict(vocab_size=40, n_tokens=6, n_slices=3, dx=3, dt=2) | kw))


def _windows(cfg, batch=6, seed=0):
    """Ragged sentences (0..N tokens each); window 2 has no input token at all."""
    w = ragged_windows(cfg, batch, seed)
    w[2, :-1] = 0
    return w


@pytest.mark.parametrize("groups", [1, 2, 3])
def test_compact_rows_are_the_positions_that_reach_the_loss(groups):
    cfg = _cfg()
    w = _windows(cfg)
    batch = compact_windows(w, groups=groups, buckets=4)
    n_rows, n_target_rows = compact_size(batch)
    per_group, positions = len(w) // groups, cfg.n_tokens * cfg.n_slices
    multiple = -(-per_group * positions // 4)
    assert n_rows % multiple == 0 and n_target_rows % multiple == 0 and n_target_rows <= n_rows
    assert batch["grid"].shape == (groups, per_group, positions)
    inputs = np.swapaxes(w[:, :-1], 1, 2).reshape(len(w), -1)  # (B, P), p = x·T + t
    targets = np.swapaxes(w[:, 1:], 1, 2).reshape(len(w), -1)
    for g in range(groups):
        grid, slot = batch["grid"][g].reshape(-1), batch["slot"][g]
        used = grid < n_rows
        assert np.array_equal(slot[grid[used]], np.flatnonzero(used))  # slot ∘ grid = identity
        real_rows = np.flatnonzero(slot < per_group * positions)
        assert np.array_equal(np.sort(grid[used]), real_rows)  # every real row sits in one slot
        got = set()
        for row in real_rows:
            window = g * per_group + slot[row] // positions
            p = batch["position"][g, row] * cfg.n_slices + batch["slice"][g, row]
            assert slot[row] % positions == p  # each position keeps its place in the grid
            assert batch["tokens"][g, row] == inputs[window, p]
            if row < n_target_rows:
                assert batch["targets"][g, row] == targets[window, p]
            else:
                assert targets[window, p] == 0  # every target sits in the first R_t rows
            got.add((int(window), int(p)))
        member = range(g * per_group, (g + 1) * per_group)
        expected = {
            (b, p)
            for b in member
            for p in range(positions)
            if inputs[b, p] or targets[b, p] or not inputs[b].any()  # a window without keys stays whole
        }
        assert got == expected
        assert np.all(batch["tokens"][g, slot == per_group * positions] == 0)  # filler rows are PAD


def test_compact_windows_rejects_bad_arguments():
    w = _windows(_cfg())
    with pytest.raises(ValueError, match="not divisible into 4 groups"):
        compact_windows(w, groups=4)
    with pytest.raises(ValueError, match="buckets must be at least 1"):
        compact_windows(w, buckets=0)


def test_move_rows_backward_is_the_inverse_gather():
    with jax.enable_x64(True):
        x = jax.random.normal(jax.random.key(0), (2, 5, 3), jnp.float64)
        index = jnp.array([[4, 0, 5, 2], [1, 5, 3, 0]])  # 5 = M: an empty slot
        inverse = jnp.array([[1, 4, 3, 4, 0], [3, 0, 4, 2, 4]])  # 4 = M': row not in any slot
        cot = jax.random.normal(jax.random.key(1), (2, 4, 3), jnp.float64)

        def reference(v):  # plain gather, differentiated by autodiff (a scatter-add)
            padded = jnp.concatenate([v, jnp.zeros_like(v[:, :1])], axis=1)
            return jnp.take_along_axis(padded, index[..., None], axis=1)

        np.testing.assert_array_equal(move_rows(x, index, inverse), reference(x))
        got = jax.vjp(lambda v: move_rows(v, index, inverse), x)[1](cot)[0]
        expected = jax.vjp(reference, x)[1](cot)[0]
        np.testing.assert_array_equal(got, expected)


ZPX = ZPXConfig(score="zpx_angle_sphere", channels=3, center_weight=0.3)


@pytest.mark.parametrize(
    "score,all_groups,variant",
    [
        (STANDARD, (1, 3), {}),
        (ZPX, (2,), {}),
        (STANDARD, (2,), {"token_code": "flat"}),
        (STANDARD, (2,), {"attention_grid": "axial"}),
    ],  # one group, several, uneven
    ids=["standard", "zpx", "flat", "axial"],
)
def test_compact_loss_and_gradient_equal_the_full_width(score, all_groups, variant):
    """One forward serves both layouts, a score variant (its term and its regulariser), the flat
    token code and axial attention included. In training mode, where the compact rows must keep each
    window's dropout masks; eval mode is the same forward without them, and the loop test below
    validates on compact batches against full-width ones."""
    with jax.enable_x64(True):
        cfg = _cfg(dropout=0.3, score=score, **variant)
        params = numpy_params(rank4jax.init_params, cfg, jnp.float64)  # nothing to compile
        windows = _windows(cfg)
        rng = jax.random.key(5)

        @jax.jit  # one program per layout for the sums and the objective's gradient
        def sums_and_grad(p, batch):
            def objective(p):
                sums = RANK4.loss_sums(p, batch, cfg, train=True, rng=rng)
                return sums["objective"], sums

            (_, sums), grad = jax.value_and_grad(objective, has_aux=True)(p)
            return sums, grad

        full, grad_full = sums_and_grad(params, jnp.asarray(windows))
        assert float(full["window_tokens"]) > 0 and float(full["last_slice_tokens"]) > 0
        for groups in all_groups:
            batch = jax.tree.map(jnp.asarray, compact_windows(windows, groups=groups, buckets=4))
            compact, grad = sums_and_grad(params, batch)
            for key, value in full.items():
                np.testing.assert_allclose(float(compact[key]), float(value), rtol=1e-12, atol=1e-12, err_msg=key)
            assert max_leaf_diff(grad, grad_full) < 1e-12


def test_only_the_autodiff_model_compacts():
    assert RANK4.layouts(_cfg()) == ("trimmed", "compact")
    assert RANK4.layouts(_cfg(score=ZPX)) == ("trimmed", "compact")
    assert RANK4.layouts(_cfg(attention="analytic")) == ("trimmed",)  # the §6 backward runs on windows


def test_training_with_compaction_matches_training_without(tmp_path, monkeypatch):
    calls = []  # the batch size of every compacted batch: training (8) and validation (16) batches
    monkeypatch.setattr(batches, "compact_windows", lambda w, **kw: calls.append(len(w)) or compact_windows(w, **kw))
    losses, compacted, validation, layouts = {}, {}, {}, {}
    # the compact run keeps tiny_config's buckets: its programs are the ones the other loop tests compile
    for name, buckets in (("compact", tiny_config().compact_buckets), ("windows", 0)):
        config = tiny_config(**{"num_steps": 4, "log_every": 1, "eval_every": 4, "checkpoint_every": 4})
        config.compact_buckets = buckets
        calls.clear()
        layouts[name] = train(config, str(tmp_path / name))["batch_layout"]
        compacted[name] = (calls.count(config.batch_size) >= 4, calls.count(config.eval_batch_size) > 0)
        metrics = read_metrics(str(tmp_path / name))
        losses[name] = [r["loss"] for r in metrics["train"]]
        validation[name] = metrics["validation"][-1]
    # the loop really ran the compact path, every training step (the one compiled step takes compact
    # batches only; grain builds them, a few ahead of the loop), and validated on compact batches too
    assert layouts == {"compact": "compact", "windows": "trimmed"}
    assert compacted == {"compact": (True, True), "windows": (False, False)}
    assert len(losses["compact"]) == 4
    np.testing.assert_allclose(losses["compact"], losses["windows"], rtol=0, atol=1e-5)
    for key in ("window_ce", "last_slice_ce", "token_accuracy"):
        np.testing.assert_allclose(validation["compact"][key], validation["windows"][key], rtol=1e-5, err_msg=key)
