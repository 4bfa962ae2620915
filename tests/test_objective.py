"""The rank-4 objective and the selection loss as settings.

- ``model.objective_slices="last"``: the training objective is the mean CE over the content tokens
  of S(T) alone; its value and gradient equal a by-hand S(T)-only loss from ``rank4jax.forward``, on
  full windows and on a compact batch (float64). ``"all"`` (the paper's) is the mean over S(1..T).
- ``selection="last_slice"``: the best checkpoint and early stopping follow the validation LS(T);
  both settings are in the run's identity (a resume under another value is refused), and a saved
  config written before they existed reads as the defaults.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import numpy_params, ragged_windows, rank4_cfg, tiny_config

import rank4jax
from rank4jax.checkpoint.storage import RunCheckpoints
from rank4jax.data.compact import compact_windows
from rank4jax.engine.run_config import identity_differences, to_json_dict, validate
from rank4jax.errors import CheckpointError, ConfigError
from rank4jax.models.family import RANK4
from rank4jax.training.loop import train
from rank4jax.training.metrics import read_metrics


def _cfg(**kw):
    return rank4_cfg(**(dict(vocab_size=30, n_tokens=5, n_slices=3, dx=3, dt=2) | kw))


def _windows(cfg, batch=4, seed=0):
    return ragged_windows(cfg, batch, seed, lengths=(1, cfg.n_tokens + 1))


def _by_hand(params, windows, cfg, slices):
    """Mean CE over the non-PAD targets of the given target slices, from the full logits."""
    logits = rank4jax.forward(params, windows[:, :-1], cfg)  # (B, N, T, V)
    targets = jnp.swapaxes(windows[:, 1:], 1, 2)  # (B, N, T)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)[:, :, slices]
    mask = (targets != 0)[:, :, slices].astype(ce.dtype)
    return jnp.sum(ce * mask) / jnp.sum(mask)


@pytest.mark.parametrize("objective", ["all", "last"])
def test_objective_and_gradient_equal_the_by_hand_loss(objective):
    cfg = _cfg(objective_slices=objective)
    slices = slice(None) if objective == "all" else slice(-1, None)
    windows = _windows(cfg)
    compact = compact_windows(windows, groups=1, buckets=2)

    def family_objective(p, batch):
        return RANK4.loss_sums(p, batch, cfg)["objective"]

    @jax.jit
    def values(p, w, c):
        hand = jax.value_and_grad(lambda q: _by_hand(q, w, cfg, slices))(p)
        full = jax.value_and_grad(family_objective)(p, w)
        packed = jax.value_and_grad(family_objective)(p, c)
        return hand, full, packed

    with jax.enable_x64(True):
        params = numpy_params(rank4jax.init_params, cfg, np.float64)
        hand, full, packed = values(params, jnp.asarray(windows), jax.tree.map(jnp.asarray, compact))
        for value, grad in (full, packed):
            np.testing.assert_allclose(float(value), float(hand[0]), rtol=1e-12, atol=0)
            for a, b in zip(jax.tree.leaves(grad), jax.tree.leaves(hand[1]), strict=True):
                np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-12)


def test_an_unknown_objective_or_selection_is_one_config_error():
    with pytest.raises(ConfigError, match="objective_slices must be one of"):
        _cfg(objective_slices="first")
    with pytest.raises(ConfigError, match="selection must be one of window, last_slice, got 'ls'"):
        validate(tiny_config(selection="ls"))


def test_a_config_saved_before_the_settings_existed_reads_as_their_defaults():
    config = tiny_config()
    saved = to_json_dict(config)
    del saved["selection"], saved["model"]["objective_slices"]
    assert identity_differences(saved, config) == []
    assert identity_differences(saved, tiny_config(selection="last_slice")) == [
        "selection: checkpoint has 'window', this run has 'last_slice'"
    ]
    assert identity_differences(saved, tiny_config(**{"model.objective_slices": "last"})) == [
        "model.objective_slices: checkpoint has 'all', this run has 'last'"
    ]


def test_last_slice_selection_picks_and_stops_on_the_validation_ls(tmp_path):
    """S(T)-only objective, selected on LS(T) with early stopping: the best checkpoint is the
    validated step with the lowest validation LS(T) (the checkpoints' best by the logged LS(T)), the
    summary and the report say so, and a resume under the other value is refused."""
    config = tiny_config(
        selection="last_slice", num_steps=12, early_stop_patience=3, **{"model.objective_slices": "last"}
    )
    summary = train(config, str(tmp_path))
    val = {r["step"]: r for r in read_metrics(str(tmp_path))["validation"]}
    ls = {step: r["last_slice_ce"] for step, r in val.items()}
    best = min(ls, key=ls.get)
    assert summary["best_step"] == best
    assert (summary["selection"], summary["objective"]) == ("last_slice", "S(T) only")
    lowest, since, stop = float("inf"), 0, None  # early stopping by hand, on LS(T)
    for step in sorted(ls):
        lowest, since = (ls[step], 0) if ls[step] < lowest else (lowest, since + 1)
        if since >= 3:
            stop = step
            break
    assert summary["step"] == (stop or 12) and summary["early_stopped"] == (stop is not None)
    with RunCheckpoints(str(tmp_path), read_only=True) as ckpt:  # the run's config.json names its selection
        on_disk = ckpt.all_steps()
        assert ckpt.best_metric() == min(((s, ls[s]) for s in on_disk), key=lambda item: (item[1], item[0]))
    with pytest.raises(CheckpointError, match="selection: checkpoint has 'last_slice', this run has 'window'"):
        train(tiny_config(num_steps=12, **{"model.objective_slices": "last"}), str(tmp_path))
