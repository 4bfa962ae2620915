"""The 1-D causal baseline (SPEC §7): packing, cached free-running decode, loss denominators."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rank4jax
from rank4jax.engine.data_setup import prepare_data
from rank4jax.evaluation.report import evaluate_run
from rank4jax.models import baseline as bl
from rank4jax.models.family import BASELINE, RANK4
from rank4jax.runs import load_run
from tests.helpers import numpy_params, tiny_config


def small_cfg(**kw):
    base = dict(vocab_size=30, n_tokens=5, n_slices=3, dx=4, dt=3, n_heads=3, n_layers=2, dropout=0.0)
    return bl.BaselineConfig(**(base | kw))


def windows_with_padding(seed=1):
    w = np.array(jax.random.randint(jax.random.key(seed), (3, 4, 5), 4, 30), np.int32)
    w[:, :, 3:] = 0
    w[1, 1] = 0  # a PAD-only context sentence
    w[2, 3, 1:] = 0  # a one-token target sentence
    return jnp.asarray(w)


def test_paper_parameter_count():
    cfg = bl.BaselineConfig(36_711, 16, 4, 64, 32, 4, 2)
    assert bl.count_params(cfg) == 175_888_384
    shapes = jax.eval_shape(lambda: bl.init_params(jax.random.key(0), cfg))
    assert sum(x.size for layer in shapes["layers"] for x in jax.tree_util.tree_leaves(layer["attn"])) == 33_554_432
    assert shapes["embed"].size == 75_184_128


def test_packing_with_a_pad_only_sentence():
    w = np.zeros((1, 4, 3), np.int32)
    w[0, 0] = [5, 6, 0]
    w[0, 1] = [0, 0, 0]  # PAD-only sentence
    w[0, 2] = [7, 0, 0]
    w[0, 3] = [8, 9, 0]  # S(T)
    packed = bl.pack(jnp.asarray(w), bl.BaselineConfig(20, 3, 3, 2, 2, 1, 1))
    assert packed["context"].tolist() == [[2, 5, 6, 7, 0, 0, 0, 0, 0, 0]]  # BOS + tokens, temporal order
    assert packed["context_len"].tolist() == [4]
    assert packed["targets"].tolist() == [[8, 9, 3, 0]]  # S(T) then EOS, outside the context
    assert not set(packed["context"][0].tolist()) & {8, 9}


decode = jax.jit(bl.decode, static_argnums=2, static_argnames="teacher_forcing")  # one compile, not op by op
full_logits = jax.jit(bl.full_logits, static_argnums=3)


def test_cached_decode_equals_full_recomputation():
    cfg = small_cfg()
    with jax.enable_x64(True):
        params = numpy_params(bl.init_params, cfg, np.float64)  # at the init's scale; nothing to compile
        for forced in (False, True):
            out = decode(params, windows_with_padding(), cfg, teacher_forcing=forced)
            full = full_logits(params, out, out["fed"], cfg)["logits"]
            np.testing.assert_allclose(np.asarray(out["logits"]), np.asarray(full), rtol=0, atol=1e-10)
    params32 = numpy_params(bl.init_params, cfg)
    out = decode(params32, windows_with_padding(), cfg)
    np.testing.assert_allclose(
        np.asarray(out["logits"]), np.asarray(full_logits(params32, out, out["fed"], cfg)["logits"]), atol=1e-5
    )


def test_free_running_never_sees_gold_target_tokens():
    cfg = small_cfg()
    params = numpy_params(bl.init_params, cfg)
    w = windows_with_padding()
    other = w.at[:, -1, :3].set(jnp.array([11, 12, 13]))  # different gold S(T), same length
    free_a, free_b = decode(params, w, cfg), decode(params, other, cfg)
    np.testing.assert_array_equal(np.asarray(free_a["logits"]), np.asarray(free_b["logits"]))
    np.testing.assert_array_equal(np.asarray(free_a["fed"]), np.argmax(np.asarray(free_a["logits"])[:, :-1], -1))
    forced_a = decode(params, w, cfg, teacher_forcing=True)
    forced_b = decode(params, other, cfg, teacher_forcing=True)
    assert not np.allclose(np.asarray(forced_a["logits"]), np.asarray(forced_b["logits"]))  # the check can fail


def test_ls_denominator_matches_rank4_and_eos_is_in_the_selection_loss():
    w = windows_with_padding()
    b_cfg = BASELINE.make_config({**dict(n_tokens=5, n_slices=3, dx=4, dt=3, n_heads=3, n_layers=2, dropout=0.0)}, 30)
    r_cfg = RANK4.make_config(
        dict(n_tokens=5, n_slices=3, dx=4, dt=3, n_heads=3, n_layers=2, dropout=0.0, attention="autodiff"), 30
    )
    b = jax.jit(BASELINE.loss_sums, static_argnums=2)(numpy_params(bl.init_params, b_cfg), w, b_cfg)
    r = jax.jit(RANK4.loss_sums, static_argnums=2)(numpy_params(rank4jax.init_params, r_cfg), w, r_cfg)
    content = int(np.sum(np.asarray(w[:, -1]) != 0))
    assert float(b["last_slice_tokens"]) == float(r["last_slice_tokens"]) == content
    assert float(b["window_tokens"]) == content + 3  # plus one EOS per window


def test_compare_writes_a_table_over_the_same_tokens_and_the_baseline_runs_through_the_shared_loop(tmp_path):
    import json

    from rank4jax.experiments.compare import compare

    rank4 = tiny_config(num_steps=2, eval_every=2, checkpoint_every=2)
    base = tiny_config(num_steps=2, eval_every=2, checkpoint_every=2, **{"model_family": "baseline"})
    wide = tiny_config(num_steps=2, eval_every=2, checkpoint_every=2, **{"model_family": "baseline", "model.dx": 8})
    result = compare(rank4, base, str(tmp_path), split="validation", wide_config=wide)
    tokenizer = load_run(str(tmp_path / "rank4")).tokenizer
    for name, family, config in (
        ("rank4", RANK4, rank4),
        ("baseline", BASELINE, base),
        ("baseline_wide", BASELINE, wide),
    ):
        assert result[f"{name}_params"] == family.count_params(family.make_config(config.model, tokenizer.vocab_size))
    last = prepare_data(rank4, tokenizer).windows["validation"].windows[:, -1]  # S(T) of every window
    assert result["ls_tokens"] == int(np.sum(last != 0))  # both models over S(T)'s every token
    table = (tmp_path / "compare.md").read_text()
    assert "| rank-4 LS(T) | baseline LS(T) | Δ |" in table and "| width-matched baseline |" in table
    assert result["delta_wide"] == result["baseline_wide_ls"] - result["rank4_ls"]  # each over the same tokens
    assert result["baseline_wide_params"] > result["baseline_params"]  # D = 16 against 8: a wider table
    assert json.loads((tmp_path / "compare.json").read_text())["delta"] == result["delta"]
    assert (tmp_path / "plots" / "compare_curves.png").is_file()
    # the baseline's run is an ordinary run of the shared loop: its summary, and evaluate_run on it
    summary = json.loads((tmp_path / "baseline" / "train_summary.json").read_text())
    assert summary["model_family"] == "baseline" and summary["step"] == 2
    report = evaluate_run(str(tmp_path / "baseline"), split="validation", num_examples=2, rollout_steps=1)
    run = load_run(str(tmp_path / "baseline"), report["step"])  # LS(T) by hand, window by window
    windows = prepare_data(base, tokenizer).windows["validation"].windows
    ls = jax.jit(BASELINE.last_slice_ce, static_argnums=2)
    per_window = np.asarray(ls(run.params, windows, run.model_cfg), dtype=np.float64)
    tokens = np.sum(windows[:, -1] != 0, axis=-1)
    assert report["last_slice_ce"] == pytest.approx(np.sum(per_window * tokens) / np.sum(tokens), rel=1e-5)
    assert len(report["examples"]) == 2


def test_compare_refuses_configs_with_different_windows(tmp_path):
    import pytest

    from rank4jax.errors import ConfigError
    from rank4jax.experiments.compare import compare

    base = tiny_config(**{"model_family": "baseline", "model.n_tokens": 6})
    with pytest.raises(ConfigError, match="model.n_tokens"):
        compare(tiny_config(), base, str(tmp_path))


def test_all_pad_padding_rows_carry_no_targets():
    """Evaluation pads its last batch with all-PAD windows: they must add nothing to any sum."""
    cfg = small_cfg()
    params = numpy_params(bl.init_params, cfg)
    w = windows_with_padding()
    padded = jnp.asarray(np.concatenate([w, np.zeros_like(w[:2])]))
    target_sums, pack = jax.jit(bl.target_sums), jax.jit(bl.pack, static_argnums=1)  # not a program per op
    a = target_sums(decode(params, w, cfg)["logits"], pack(w, cfg)["targets"])
    out = decode(params, padded, cfg)
    b = target_sums(out["logits"], out["targets"])
    assert out["targets"][3:].tolist() == [[0] * 6] * 2
    for key in a:
        np.testing.assert_allclose(float(a[key]), float(b[key]), rtol=1e-6)
