"""Exact-value tests of the rank-4 forward pass on tiny hand-checkable cases (SPEC §2–§4)."""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rank4jax
from rank4jax.models.common import keep_mask, sinusoid_table
from rank4jax.models.rank4.attention import attention_weights
from rank4jax.models.rank4.codes import apply_embedding, apply_readout
from rank4jax.models.rank4.losses import last_slice_mean_ce
from rank4jax.models.rank4.model import key_padding_mask
from tests.helpers import hand_position_tables, jitted_forward, numpy_params


def tiny_cfg(**kw):
    base = dict(vocab_size=6, n_tokens=2, n_slices=2, dx=2, dt=3, n_heads=2, n_layers=2, dropout=0.0)
    return rank4jax.Rank4Config(**(base | kw))


def test_sinusoid_table_by_hand():
    table = sinusoid_table(4, 3)
    for p in range(4):
        expected = [math.sin(p), math.cos(p), math.sin(p / 10000 ** (2 / 3))]
        np.testing.assert_allclose(table[p], expected, rtol=0, atol=1e-15)


def test_input_tensor_exact():
    """V=6, N=2, T=2, dx=2, dt=3: X = Esem⊗Etmp + P[x, n] + R[x+t, q], every entry by hand."""
    cfg = tiny_cfg()
    sem = np.arange(12, dtype=np.float64).reshape(6, 2) / 10.0
    tmp = np.arange(18, dtype=np.float64).reshape(6, 3) / 7.0 - 1.0
    sem[0] = 0.0
    tmp[0] = 0.0
    p_tab, r_tab, tok_btn = hand_position_tables()  # P[x][n], R[x+t][q], tok[b, t, x] (B=1, T=2, N=2)
    expected = np.zeros((1, 2, 2, 2, 3))
    for x in range(2):
        for t in range(2):
            v = tok_btn[0, t, x]
            for n in range(2):
                for q in range(3):
                    expected[0, x, t, n, q] = sem[v, n] * tmp[v, q] + p_tab[x][n] + r_tab[x + t][q]
    with jax.enable_x64(True):
        params = {"sem": jnp.asarray(sem), "tmp": jnp.asarray(tmp)}
        got = apply_embedding(params, jnp.asarray(tok_btn).transpose(0, 2, 1), cfg)
        assert got.dtype == jnp.float64
        np.testing.assert_allclose(np.asarray(got), expected, rtol=0, atol=1e-14)


def test_pad_rows_start_at_zero():
    params = rank4jax.init_params(jax.random.key(0), tiny_cfg())
    assert not np.any(np.asarray(params["embed"]["sem"][0]))
    assert not np.any(np.asarray(params["embed"]["tmp"][0]))
    assert np.all(np.asarray(params["embed"]["sem"][1:]) != 0)


def test_pad_key_gets_exactly_zero_weight_and_a_query_without_keys_none():
    key = jax.random.key(1)
    q = jax.random.normal(key, (2, 1, 4, 6)) * 30.0  # large scores
    k = jax.random.normal(jax.random.fold_in(key, 1), (2, 1, 4, 6)) * 30.0
    mask = jnp.array([[True, False, True, False], [False, False, False, False]])
    a = np.asarray(attention_weights(q, k, mask))
    assert np.all(a[0, :, :, 1] == 0.0) and np.all(a[0, :, :, 3] == 0.0)
    np.testing.assert_allclose(a[0].sum(-1), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(a[1], np.zeros((1, 4, 4), np.float32))  # no key: zero weights, zero output


def test_pad_positions_never_reach_other_positions():
    """PAD keys get zero weight in every layer: changing what sits at PAD positions (the PAD rows of
    Esem/Etmp) leaves the logits at every non-PAD position unchanged, apart from vocab entry 0
    whose readout row is Esem[PAD]."""
    cfg = tiny_cfg()
    params = rank4jax.init_params(jax.random.key(5), cfg)
    inputs = jnp.array([[[4, 0], [5, 3]]])  # PAD at (t=0, x=1)
    assert np.asarray(key_padding_mask(inputs)).tolist() == [[True, True, False, True]]  # p = x·T + t
    changed = jax.tree_util.tree_map(lambda a: a, params)
    changed["embed"]["sem"] = params["embed"]["sem"].at[0].set(3.0)
    changed["embed"]["tmp"] = params["embed"]["tmp"].at[0].set(-2.0)
    a = np.asarray(jitted_forward(params, inputs, cfg))
    b = np.asarray(jitted_forward(changed, inputs, cfg))
    for x, t in [(0, 0), (0, 1), (1, 1)]:
        np.testing.assert_allclose(a[0, x, t, 1:], b[0, x, t, 1:], rtol=1e-6, atol=1e-6)
    assert not np.allclose(a[0, 1, 0], b[0, 1, 0])  # the PAD position itself did change


def test_no_temporal_causal_mask():
    cfg = tiny_cfg()
    params = rank4jax.init_params(jax.random.key(2), cfg)
    a = jnp.array([[[4, 5], [2, 3]]])
    b = a.at[0, 1, 0].set(1)  # change a token of the last input slice
    la, lb = jitted_forward(params, a, cfg), jitted_forward(params, b, cfg)
    assert np.max(np.abs(np.asarray(la[:, :, 0] - lb[:, :, 0]))) > 1e-4  # first slice changes


def test_readout_equals_naive_einsum():
    key = jax.random.key(3)
    v, dx, dt = 7, 3, 2
    sem = jax.random.normal(key, (v, dx))
    tmp = jax.random.normal(jax.random.fold_in(key, 1), (v, dt))
    y = jax.random.normal(jax.random.fold_in(key, 2), (2, 5, dx, dt))
    naive = jnp.einsum("bpnq,vn,vq->bpv", y, sem, tmp)
    got = apply_readout(sem, tmp, y.reshape(2, 5, dx * dt))
    np.testing.assert_allclose(np.asarray(got), np.asarray(naive), rtol=1e-5, atol=1e-5)


def _manual_ce(logits, target):
    return float(np.log(np.sum(np.exp(logits))) - logits[target])


def test_losses_ignore_pad_and_last_slice_only():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(1, 2, 2, 5)).astype(np.float64)  # (B, N, T, V)
    targets = np.array([[[3, 0], [4, 2]]])  # (B, T, N): slice 0 = [3, PAD], slice 1 = [4, 2]
    ce = {(x, t): _manual_ce(logits[0, x, t], targets[0, t, x]) for x in range(2) for t in range(2)}
    with jax.enable_x64(True):
        out = rank4jax.window_losses(jnp.asarray(logits), jnp.asarray(targets))
        per_window = last_slice_mean_ce(jnp.asarray(logits), jnp.asarray(targets))
    window = (ce[0, 0] + ce[0, 1] + ce[1, 1]) / 3  # (x=1, t=0) is PAD
    last = (ce[0, 1] + ce[1, 1]) / 2
    assert float(out["window_ce"]) == pytest.approx(window, abs=1e-12)
    assert float(out["last_slice_ce"]) == pytest.approx(last, abs=1e-12)
    assert float(per_window[0]) == pytest.approx(last, abs=1e-12)
    correct = [np.argmax(logits[0, x, t]) == targets[0, t, x] for (x, t) in [(0, 0), (0, 1), (1, 1)]]
    assert float(out["token_accuracy"]) == pytest.approx(np.mean(correct), abs=1e-12)
    # changing the logits at a PAD target changes nothing
    logits2 = logits.copy()
    logits2[0, 1, 0] += 100.0
    with jax.enable_x64(True):
        out2 = rank4jax.window_losses(jnp.asarray(logits2), jnp.asarray(targets))
    assert float(out2["window_ce"]) == float(out["window_ce"])


def test_forward_float64_follows_params():
    cfg = tiny_cfg()
    init, forward = jax.jit(rank4jax.init_params, static_argnums=(1, 2)), jitted_forward  # eager: a program per op
    with jax.enable_x64(True):
        params = init(jax.random.key(0), cfg, jnp.float64)
        logits = forward(params, jnp.array([[[4, 5], [2, 3]]]), cfg)
        assert logits.dtype == jnp.float64
    logits32 = forward(init(jax.random.key(0), cfg, jnp.float32), jnp.array([[[4, 5], [2, 3]]]), cfg)
    assert logits32.dtype == jnp.float32


def test_forward_jits_and_dropout_is_independent():
    cfg = tiny_cfg(dropout=0.5)
    params = rank4jax.init_params(jax.random.key(0), cfg)
    x = jnp.array([[[4, 5], [2, 3]]])
    fwd = jax.jit(rank4jax.forward, static_argnames=("cfg", "train"))
    eval_a, eval_b = fwd(params, x, cfg), fwd(params, x, cfg)
    np.testing.assert_array_equal(np.asarray(eval_a), np.asarray(eval_b))
    t1 = fwd(params, x, cfg, train=True, rng=jax.random.key(1))
    t2 = fwd(params, x, cfg, train=True, rng=jax.random.key(2))
    assert not np.allclose(np.asarray(t1), np.asarray(t2))
    with pytest.raises(ValueError, match="rng"):
        rank4jax.forward(params, x, cfg, train=True)


def test_keep_mask_is_drawn_per_window_four_elements_per_threefry_hash():
    keys = jax.random.split(jax.random.key(3), 3)
    mask = keep_mask(keys, (3, 64, 128), 0.1)
    np.testing.assert_array_equal(mask[1:2], keep_mask(keys[1:2], (1, 64, 128), 0.1))  # a window's own key
    # keep probability round(0.9 · 2**16) / 2**16 = 0.899994; 3 · 8192 draws, 0.01 is five standard deviations
    assert mask.dtype == jnp.bool_ and abs(float(mask.mean()) - 58982 / 2**16) < 0.01
    text = jax.jit(lambda k: keep_mask(k, (3, 64, 128), 0.1)).lower(keys).as_text()
    hashes = re.search(r"call @threefry2x32\(.*?\) : \((.*?)\) ->", text).group(1)
    assert "tensor<1x2048xui32>" in hashes  # 8192 16-bit elements per window from 2048 64-bit hashes


def test_paper_parameter_counts_without_allocating():
    for heads, layers, expected in [(4, 2, 172_512_128), (2, 2, 122_180_480), (4, 3, 256_416_640)]:
        cfg = rank4jax.Rank4Config(36_711, 16, 4, 64, 32, heads, layers)
        assert rank4jax.count_params(cfg) == expected


def test_parameter_breakdown_matches_table3():
    cfg = rank4jax.Rank4Config(36_711, 16, 4, 64, 32, 4, 2)
    shapes = jax.eval_shape(lambda: rank4jax.init_params(jax.random.key(0), cfg))
    attn = sum(leaf.size for layer in shapes["layers"] for leaf in jax.tree_util.tree_leaves(layer["attn"]))
    tables = sum(leaf.size for leaf in jax.tree_util.tree_leaves((shapes["embed"], shapes["readout"])))
    assert attn == 100_663_296 and tables == 4_699_008


def test_attention_maps_rows_sum_to_one_and_pad_keys_are_zero():
    from rank4jax.models.rank4 import attention_maps

    cfg = tiny_cfg()
    params = rank4jax.init_params(jax.random.key(4), cfg)
    inputs = jnp.array([[[4, 0], [5, 3]]])  # PAD at (t=0, x=1)
    maps = attention_maps(params, inputs, cfg)
    assert len(maps) == 2 and maps[0].shape == (1, 2, 2, 2, 2, 2)
    for a in maps:
        a = np.asarray(a)
        np.testing.assert_allclose(a.sum(axis=(-2, -1)), 1.0, rtol=1e-6)
        assert np.all(a[..., 1, 0] == 0.0)  # key (x'=1, t'=0) is PAD


def test_dropout_keeps_expected_fraction_and_mean():
    from rank4jax.models.common import dropout

    x = jnp.ones((200_000,))
    y = np.asarray(dropout(x, 0.1, jax.random.key(0), train=True))
    kept = y != 0
    assert abs(kept.mean() - 0.9) < 0.003
    assert abs(y.mean() - 1.0) < 0.005  # inverted scaling preserves the expectation
    np.testing.assert_array_equal(np.asarray(dropout(x, 0.1, None, train=False)), np.asarray(x))


def test_next_state_logits_from_a_given_input_tensor_and_its_gradient():
    """``embedded=`` runs the model on a given X (same logits for X = the embedding of the inputs);
    jax.grad with respect to X matches a finite difference (float64)."""
    with jax.enable_x64(True):
        cfg = tiny_cfg()
        params = numpy_params(rank4jax.init_params, cfg, jnp.float64)
        inputs = np.random.default_rng(4).integers(1, cfg.vocab_size, (2, cfg.n_slices, cfg.n_tokens)).astype(np.int32)
        inputs[:, :, -1] = 0
        x = jax.jit(apply_embedding, static_argnums=2)(params["embed"], np.swapaxes(inputs, 1, 2), cfg)
        next_state = jax.jit(rank4jax.models.rank4.next_state_logits, static_argnums=2)  # eager: a program per op
        plain = next_state(params, inputs, cfg)
        given = next_state(params, inputs, cfg, embedded=x)
        np.testing.assert_allclose(given, plain, rtol=0, atol=1e-12)

        @jax.jit
        def logit(x):
            return rank4jax.models.rank4.next_state_logits(params, inputs, cfg, embedded=x)[0, 1, 5]

        grad = jax.jit(jax.grad(logit))(x)
        where = (0, 0, 0, 1, 0)  # batch 0, token 0 of the first input slice, fiber (1, 0)
        eps = 1e-6
        numeric = (logit(x.at[where].add(eps)) - logit(x.at[where].add(-eps))) / (2 * eps)
        assert abs(float(grad[where]) - float(numeric)) < 1e-7 and abs(float(numeric)) > 1e-6
        assert float(jnp.abs(grad[1]).max()) == 0.0  # another window's X never reaches this logit


def test_token_ids_outside_the_vocabulary_give_nan_not_another_token():
    """An id below 0 used to read as id V − 1 and one of V or more as garbage: both now make their
    positions' outputs NaN, in the functional model and the Flax one alike; a target outside the
    vocabulary is a NaN loss, not a finite one."""

    from flax import nnx

    import rank4jax.nn as r4nn

    cfg = rank4jax.Rank4Config(vocab_size=11, n_tokens=3, n_slices=2, dx=2, dt=3, n_heads=2, n_layers=1, dropout=0.0)
    params = numpy_params(rank4jax.init_params, cfg)
    model = r4nn.Rank4Model.from_params(params, cfg, deterministic=True)
    forward, module = jitted_forward, nnx.jit(lambda model, x: model(x))
    window_ce = jax.jit(lambda logits, targets: rank4jax.window_losses(logits, targets)["window_ce"])
    good = np.ones((1, 2, 3), np.int32)
    assert bool(np.isfinite(forward(params, good, cfg)).all())
    for bad in (-1, 11):
        inputs = good.copy()
        inputs[0, 1, 2] = bad
        assert bool(np.isnan(forward(params, inputs, cfg)).any()), bad
        assert bool(np.isnan(module(model, inputs)).any()), bad
    logits, targets = forward(params, good, cfg), good.copy()
    targets[0, 0, 0] = -1
    assert np.isnan(float(window_ce(logits, targets))) and np.isfinite(float(window_ce(logits, good)))


def test_the_papers_forward_runs_through_seven_files_and_no_variant():
    """Lowering rank4jax.forward of a one-layer paper model calls functions in at most 7 files of
    rank4jax (besides its __init__): the one layer (block.apply_layer) and what it composes, none of a
    variant's modules (axial, analytic, scores)."""
    import collections
    import pathlib
    import sys

    cfg = rank4jax.Rank4Config(vocab_size=13, n_tokens=3, n_slices=2, dx=2, dt=2, n_heads=2, n_layers=1)
    params = jax.eval_shape(lambda: rank4jax.init_params(jax.random.key(0), cfg))
    inputs = jax.ShapeDtypeStruct((2, cfg.n_slices, cfg.n_tokens), jnp.int32)
    root, files = str(pathlib.Path(rank4jax.__file__).parent), collections.Counter()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(root):
            files[frame.f_code.co_filename[len(root) + 1 :]] += 1

    sys.setprofile(profile)
    try:
        jax.jit(lambda p, i: rank4jax.forward(p, i, cfg)).lower(params, inputs)
    finally:
        sys.setprofile(None)
    files.pop("__init__.py", None)
    assert len(files) <= 7, sorted(files)
    assert "models/rank4/block.py" in files and not {"models/rank4/axial.py", "models/rank4/analytic.py",
                                                     "models/scores.py"} & set(files)  # fmt: skip
