"""ZPX geometric attention (seed 001): the encoder by hand, the matmul form of the score against the
seed's direct formula, masks on the total score, both families wired, the seed's geometry checks."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rank4jax.engine.run_config import validate
from rank4jax.errors import ConfigError
from rank4jax.experiments import zpx_verify
from rank4jax.models import baseline, rank4, zpx
from rank4jax.models.family import BASELINE, RANK4
from rank4jax.models.scores import STANDARD
from tests.helpers import numpy_params, tiny_config

SIZES = dict(vocab_size=30, n_tokens=5, n_slices=3, dx=3, dt=2, n_heads=2, n_layers=2, dropout=0.0)


def _windows(seed=0, batch=3):
    rng = np.random.default_rng(seed)
    w = rng.integers(4, SIZES["vocab_size"], size=(batch, SIZES["n_slices"] + 1, SIZES["n_tokens"])).astype(np.int32)
    w[:, :, 3:] = 0
    w[1, 0] = 0  # an empty sentence
    return jnp.asarray(w)


def test_encoder_matches_the_formulas_by_hand():
    with jax.enable_x64(True):
        params = {
            "w_r": jnp.array([[2.0], [0.0]]),
            "b_r": jnp.array([1.0]),
            "w_theta": jnp.array([[0.0], [1.0]]),
            "b_theta": jnp.array([0.0]),
            "w_b": jnp.array([[1.0], [1.0]]),
            "b_b": jnp.array([-1.0]),
        }
        h = jnp.array([0.5, -0.25])
        out = zpx.encode_phase(params, h, max_log_radius=4.0)
        log_r = 4.0 * math.tanh((2.0 * 0.5 + 1.0) / 4.0)
        theta = math.pi * math.tanh(-0.25)
        b = 1.0 / (1.0 + math.exp(-(0.25 - 1.0)))
        phi = theta + math.pi * b
        x, y = math.exp(log_r) * math.cos(phi), math.exp(log_r) * math.sin(phi)
        den = 1.0 + x * x + y * y
        expected = [log_r, math.cos(phi), math.sin(phi), 2 * x / den, 2 * y / den, (x * x + y * y - 1) / den, b]
        np.testing.assert_allclose(out["tensor"][0], expected, rtol=1e-14, atol=1e-14)
        np.testing.assert_allclose(out["phase"][0], phi, rtol=1e-14)


@pytest.mark.parametrize("score", ["zpx_angle", "zpx_angle_sphere"])
def test_matmul_scores_equal_the_direct_formula(score):
    with jax.enable_x64(True):
        cfg = zpx.ZPXConfig(score=score, channels=4, lambda_angle=0.7, lambda_sphere=-1.3)
        enc = zpx.init_phase_encoder(jax.random.key(0), 6, 4, jnp.float64)
        hq = jax.random.normal(jax.random.key(1), (2, 5, 6), jnp.float64) * 3
        hk = jax.random.normal(jax.random.key(2), (2, 7, 6), jnp.float64) * 3
        pq, pk = zpx.encode_phase(enc, hq), zpx.encode_phase(enc, hk)
        fast = zpx.geometric_scores(zpx.geometric_features(pq, cfg)[0], zpx.geometric_features(pk, cfg)[1])
        assert fast.shape == (2, 5, 7)
        np.testing.assert_allclose(fast, zpx.direct_geometric_scores(pq, pk, cfg), rtol=0, atol=1e-13)


def test_center_cancellation_counts_only_real_positions():
    phase = {"x": jnp.array([[[1.0], [2.0], [5.0]]]), "y": jnp.array([[[0.0], [-1.0], [7.0]]])}
    valid = jnp.array([[True, True, False]])
    assert float(zpx.center_cancellation(phase, valid)) == pytest.approx(3.0**2 + 1.0**2)


def test_rank4_scores_join_before_the_mask():
    """PAD keys get zero weight and the geometric term changes the real keys' weights."""
    cfg = rank4.Rank4Config(**SIZES, score=zpx.ZPXConfig(score="zpx_angle_sphere", channels=3, lambda_angle=2.0))
    params = numpy_params(rank4.init_params, cfg)  # numpy: nothing to compile
    attention_maps = jax.jit(rank4.attention_maps, static_argnums=2)  # eager, a program per primitive
    inputs = _windows()[:, :-1]
    maps = attention_maps(params, inputs, cfg)
    keys_real = np.asarray(jnp.swapaxes(inputs, 1, 2) != 0)  # (B, N, T)
    for a in maps:
        a = np.asarray(a)
        assert np.all(a[..., ~keys_real[0]][0] == 0.0)
        np.testing.assert_allclose(a.sum(axis=(-2, -1)), 1.0, atol=1e-5)
    plain = attention_maps(params, inputs, rank4.Rank4Config(**SIZES))
    assert not np.allclose(np.asarray(maps[0]), np.asarray(plain[0]), atol=1e-4)


def test_standard_parameters_unchanged_by_zpx_variant():
    plain = rank4.init_params(jax.random.key(0), rank4.Rank4Config(**SIZES))
    geo = rank4.init_params(jax.random.key(0), rank4.Rank4Config(**SIZES, score=zpx.ZPXConfig(score="zpx_angle")))
    for a, b in zip(plain["layers"], geo["layers"], strict=True):
        np.testing.assert_array_equal(a["attn"]["wq"], b["attn"]["wq"])
        assert set(b) - set(a) == {"zpx"}


def test_baseline_cached_decode_equals_full_recomputation_with_zpx():
    """The cached key features and the causal mask on the total score: the incremental decode equals a
    full causal pass over the same fed tokens."""
    with jax.enable_x64(True):
        cfg = baseline.BaselineConfig(**(SIZES | {"dt": 4}), score=zpx.ZPXConfig(score="zpx_angle_sphere", channels=3))
        params = numpy_params(baseline.init_params, cfg, jnp.float64)  # numpy: nothing to compile
        out = jax.jit(baseline.decode, static_argnums=2)(params, _windows(), cfg)  # one compile, not op by op
        full = jax.jit(baseline.full_logits, static_argnums=3)(params, out, out["fed"], cfg)
        np.testing.assert_allclose(out["logits"], full["logits"], rtol=0, atol=1e-10)
        np.testing.assert_allclose(float(out["aux"]), float(full["aux"]), rtol=1e-12)  # the running sums' term
        assert float(full["aux"]) > 0


@pytest.mark.parametrize("family", [RANK4, BASELINE])
def test_center_regulariser_enters_the_objective(family):
    sizes = SIZES | {"dt": 4}
    cfg_cls = rank4.Rank4Config if family is RANK4 else baseline.BaselineConfig
    cfgs = {
        w: cfg_cls(**sizes, score=zpx.ZPXConfig(score="zpx_angle", channels=3, center_weight=w)) for w in (0, 1, 0.5)
    }
    params = numpy_params(family.init, cfgs[1])  # numpy: nothing to compile
    loss_sums = jax.jit(family.loss_sums, static_argnums=2)  # eager, a program per primitive
    sums = {w: jax.tree.map(float, loss_sums(params, _windows(), cfg)) for w, cfg in cfgs.items()}
    assert sums[0]["objective"] == pytest.approx(sums[0]["window_ce_sum"] / sums[0]["window_tokens"], rel=1e-6)
    centre = sums[1]["objective"] - sums[0]["objective"]  # the centre-cancellation term at weight 1
    assert centre > 1e-3  # the term is there ...
    assert sums[0.5]["objective"] == pytest.approx(sums[0]["objective"] + 0.5 * centre, rel=1e-6)  # ... weighted
    assert sums[0.5]["window_ce_sum"] == sums[0]["window_ce_sum"]  # the CE itself is untouched


def test_zpx_config_errors():
    with pytest.raises(ConfigError, match="zpx.score"):
        zpx.ZPXConfig(score="zpx")
    with pytest.raises(ConfigError, match="channels"):
        zpx.ZPXConfig(score="zpx_angle", channels=0)
    with pytest.raises(ConfigError, match="needs a ZPX score"):
        zpx.zpx_config({"score": "standard", "center_weight": 0.1})
    with pytest.raises(ConfigError, match="zpx.score"):
        zpx.ZPXConfig(score="standard")  # the paper's score is scores.STANDARD, not a ZPXConfig
    with pytest.raises(ConfigError, match="channels"):
        zpx.zpx_config({"score": "standard", "channels": 0})  # checked even when unused
    assert zpx.zpx_config({"score": "standard"}) is STANDARD
    with pytest.raises(ConfigError, match="unknown model.zpx"):
        zpx.zpx_config({"score": "zpx_angle", "lambda": 1.0})
    with pytest.raises(ConfigError, match="analytic"):
        rank4.Rank4Config(**SIZES, attention="analytic", score=zpx.ZPXConfig(score="zpx_angle"))
    config = tiny_config(**{"model.zpx.score": "zpx_sphere"})
    with pytest.raises(ConfigError, match="zpx.score"):
        validate(config)
    with pytest.raises(ConfigError, match="^zpx.score must be one of"):  # an unknown score, as a run's config
        validate(tiny_config(**{"model.zpx.score": "zpx"}))


def test_export_round_trip_includes_the_encoder():
    cfg = rank4.Rank4Config(**SIZES, score=zpx.ZPXConfig(score="zpx_angle_sphere", channels=3))
    params = numpy_params(rank4.init_params, cfg)
    flat = rank4.export_params(params, cfg)
    assert flat["layers.1.zpx.w_theta"].shape == (cfg.width, 3)
    back = rank4.import_params(flat, cfg)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(back), strict=True):
        np.testing.assert_array_equal(a, b)


def test_zpx_verify_checks_hold_and_the_command_passes(monkeypatch):
    """The seed's geometry checks in float32, gradients reaching every parameter of both families, and
    ``zpx-verify`` exiting 0 on them. One test (it was three: the command recomputed both sets of
    checks, the slowest programs of this file, which the other two computed again)."""
    checks = zpx_verify.geometry_checks(jnp.float32)
    for name, value in checks.items():
        assert value <= zpx_verify.TOLERANCES[name], (name, value)
    # the seed's float32 figures are of the same order (2.98e-7, 1.19e-7)
    assert checks["sphere_norm_error"] < 1e-6 and checks["angle_rotation_invariance_error"] < 1e-6
    gradients = zpx_verify.gradient_checks(jnp.float32)
    assert sorted(gradients) == ["baseline", "rank4"]
    for good, total in gradients.values():
        assert good == total

    used = []

    def computed(values):
        def check(dtype):
            assert np.dtype(dtype) == np.float32  # the command's default
            used.append(values)
            return values

        return check

    monkeypatch.setattr(zpx_verify, "geometry_checks", computed(checks))
    monkeypatch.setattr(zpx_verify, "gradient_checks", computed(gradients))
    assert zpx_verify.main([]) == 0 and used == [checks, gradients]


def test_seed_table_combines_by_hand():
    from rank4jax.experiments.zpx_plan import combine_seeds

    def result(ls_std, ls_angle, ms):
        row = {"family": "rank4", "params": 10, "ms_per_step": ms, "training_s": 2.0 * ms, "steps": 5}
        return {
            "split": "test",
            "rows": [row | {"variant": "standard", "ls": ls_std}, row | {"variant": "angle", "ls": ls_angle}],
        }

    combined = combine_seeds([result(5.0, 4.5, 10.0), result(5.5, 4.9, 30.0)], [0, 1])
    std, angle = combined["rows"]
    assert std["ls_per_seed"] == [5.0, 5.5] and std["ls_mean"] == 5.25 and std["ls_half_range"] == 0.25
    assert angle["ls_mean"] == pytest.approx(4.7) and angle["ls_half_range"] == pytest.approx(0.2)
    assert std["ms_per_step"] == 20.0 and std["training_s"] == 40.0
    lines = combined["table"].splitlines()
    assert "seed 0 / seed 1" in lines[0] and len(lines) == 4
    assert "| rank4 | angle | 4.700 ± 0.200 | -0.550 | 4.500 / 4.900 | 10 | 5 | 20 | 40 |" == lines[3]
