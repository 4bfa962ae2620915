"""The semantic-simulation LM (seed 004) and the token-stream families: stream packing by hand, the
causal EMA, the closed-form Gaussian force against autodiff, V_θ bounds, the model card's parameter
count, the causal-leak probe (and that it can fail), the surprisal buffer, and a smoke run."""

import copy
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rank4jax.engine.state import make_optimizer
from rank4jax.errors import ConfigError
from rank4jax.experiments import splm_probe
from rank4jax.experiments.splm_report import matched_configs
from rank4jax.models import splm, stream
from rank4jax.models.family import BASELINE_LM, SPLM
from rank4jax.runs import load_run
from rank4jax.training.loop import train
from tests.helpers import numpy_params, tiny_config

SIZES = dict(vocab_size=40, n_tokens=4, n_slices=2, dx=4, dt=4, n_layers=3)


def test_pack_stream_by_hand():
    windows = jnp.array([[[5, 6, 0, 0], [0, 0, 0, 0], [7, 8, 9, 0]], [[0] * 4] * 3])  # (B=2, T+1=3, N=4)
    packed = stream.pack_stream(windows)
    assert stream.stream_slots(4, 2) == packed["inputs"].shape[1] == 13
    np.testing.assert_array_equal(packed["inputs"][0, :7], [2, 5, 6, 7, 8, 9, 0])  # BOS + tokens
    np.testing.assert_array_equal(packed["targets"][0, :7], [5, 6, 7, 8, 9, 3, 0])  # tokens + EOS
    np.testing.assert_array_equal(packed["last"][0, :7], [0, 0, 1, 1, 1, 0, 0])  # S(T) = 7 8 9
    assert not np.any(packed["inputs"][1]) and not np.any(packed["targets"][1])  # a padding row is empty


def test_causal_ema_matches_the_definition():
    with jax.enable_x64(True):
        h = jax.random.normal(jax.random.key(0), (2, 7, 3), jnp.float64)
        alpha = jnp.array([0.25, 0.9])
        xi = splm.causal_ema(h, alpha)
        for m, a in enumerate([0.25, 0.9]):
            for t in range(7):
                w = a ** (t - np.arange(t + 1))
                expected = (w[:, None] * np.asarray(h[1, : t + 1])).sum(0) / w.sum()
                np.testing.assert_allclose(xi[1, t, m], expected, rtol=1e-13, atol=1e-14)


def test_gaussian_force_is_minus_the_gradient_and_v_is_bounded():
    with jax.enable_x64(True):
        cfg = splm.SPLMConfig(**SIZES)
        params = jax.jit(splm.init_params, static_argnums=(1, 2))(jax.random.key(1), cfg, jnp.float64)
        # perturb every potential parameter so the check is not at a special point
        noise = np.random.default_rng(2)  # numpy: a jax.random draw compiles a program per shape
        params["potential"] = jax.tree_util.tree_map(
            lambda p: p + 0.3 * noise.standard_normal(p.shape), params["potential"]
        )
        h_np = 2.0 * np.random.default_rng(3).standard_normal((2, 9, cfg.width))
        h = jnp.asarray(h_np)
        # jitted (eager, every primitive compiles on its own); force and gradient in separate programs
        force = jax.jit(splm.force, static_argnums=(2, 3))
        value = jax.jit(splm.potential_value, static_argnums=(2, 3))
        minus_grad = jax.jit(
            lambda x, layer: -jax.grad(lambda y: jnp.sum(value(params, y, layer, cfg)))(x), static_argnums=1
        )
        for layer in range(cfg.n_layers):
            f, g = np.asarray(force(params, h, layer, cfg)), np.asarray(minus_grad(h, layer))  # numpy from here
            assert float(np.max(np.abs(f - g)) / np.max(np.abs(g))) <= 1e-10
        for scale in (0.0, 1e-3, 1e3, 1e8):
            v = np.asarray(value(params, jnp.asarray(scale * h_np), 0, cfg))
            assert float(v.min()) >= -cfg.xi_channels and float(v.max()) <= 0.0
            assert bool(np.all(np.isfinite(v)))


def test_model_card_parameter_count():
    cfg = splm.SPLMConfig(vocab_size=1000, n_tokens=16, n_slices=4, dx=16, dt=16, n_layers=8)
    assert splm.count_potential_params(cfg) == 4_227_104  # d = 256, L = 8, 4 channels, 8 wells


def test_causal_leak_probe_is_exactly_zero_and_can_fail():
    for potential in ("gaussian", "mlp"):
        assert splm_probe.probe(potential) == 0.0
        assert splm_probe.train_path_probe(potential) == 0.0
    assert splm_probe.probe("mlp", stop_gradient=False) > 1e-6  # without the stop-gradient it leaks


def test_surprisal_buffer_is_add_one_unigram_and_never_trained():
    counts = np.array([0, 0, 3, 1, 6, 0], np.float64)
    expected = -np.log((counts + 1) / (counts.sum() + counts.size))
    np.testing.assert_allclose(splm.unigram_surprisal(counts), expected)
    cfg = splm.SPLMConfig(**(SIZES | {"vocab_size": 6}))
    params = splm.set_surprisal(numpy_params(splm.init_params, cfg), counts)  # numpy: nothing to compile
    optimizer = make_optimizer(tiny_config().optim)
    grads = jax.jit(jax.grad(lambda p: SPLM.loss_sums(p, jnp.full((2, 3, 4), 4, jnp.int32), cfg)["objective"]))(params)
    assert not np.any(np.asarray(grads["buffers"]["surprisal"]))
    opt_state = jax.jit(optimizer.init)(params)
    updates, _ = jax.jit(optimizer.update)(grads, opt_state, params)  # weight decay 0.01 in the config
    assert not np.any(np.asarray(updates["buffers"]["surprisal"]))
    assert np.any(np.asarray(updates["embed"]))


def test_splm_config_errors():
    with pytest.raises(ConfigError, match="potential"):
        splm.SPLMConfig(**SIZES, potential="quadratic")
    with pytest.raises(ConfigError, match="xi_alphas"):
        splm.SPLMConfig(**SIZES, xi_alphas=(0.5, 1.0))
    config = tiny_config(model_family="splm")
    assert sorted(config.model) == ["dt", "dx", "n_layers", "n_slices", "n_tokens", "splm"]  # its own fields only
    config.model.dropout = 0.1
    with pytest.raises(ConfigError, match=r"model.dropout is not a field of model_family='splm'"):
        SPLM.make_config(config.model, 50)
    del config.model["dropout"]
    config.model.splm.wells_per_bank = 3
    with pytest.raises(ConfigError, match="unknown model.splm"):
        SPLM.make_config(config.model, 50)


def test_matched_configs_come_close_to_the_gaussian_count():
    config = tiny_config(model_family="splm")
    configs = matched_configs(config, 60)
    counts = {}
    for name, c in configs.items():
        family = SPLM if c.model_family == "splm" else BASELINE_LM
        counts[name] = family.count_params(family.make_config(c.model, 60))
    target = counts["splm_gaussian"]

    def count_with(name, field, value):  # the count with one size field changed
        c = copy.deepcopy(configs[name])
        section = c.model.splm if field == "mlp_hidden" else c.model
        section[field] = value
        family = SPLM if c.model_family == "splm" else BASELINE_LM
        return family.count_params(family.make_config(c.model, 60))

    # each matched size is the closest to the Gaussian's count: both neighbours are farther (counts
    # grow with the size, so no other candidate can be closer)
    for name, field, step in (("attention", "n_layers", 1), ("splm_mlp", "mlp_hidden", 8)):
        chosen = configs[name].model.splm[field] if field == "mlp_hidden" else configs[name].model[field]
        gap = abs(counts[name] - target)
        for neighbour in (chosen - step, chosen + step):
            if neighbour >= step:
                assert abs(count_with(name, field, neighbour) - target) >= gap, (name, neighbour)


@pytest.mark.parametrize("family", ["splm", "baseline_lm"])
def test_stream_family_trains_resumes_and_evaluates(tmp_path, family):
    extra = {"model.splm.potential": "mlp"} if family == "splm" else {"model.dropout": 0.0}
    config = tiny_config(model_family=family, num_steps=4, **extra)
    summary = train(config, str(tmp_path))
    assert summary["step"] == 4
    records = [json.loads(line) for line in open(os.path.join(tmp_path, "metrics.jsonl"), encoding="utf-8")]
    val = [r for r in records if r["split"] == "validation"]
    assert [r["step"] for r in val] == [2, 4] and all(np.isfinite(r["window_ce"]) for r in val)
    config.num_steps = 6
    assert train(config, str(tmp_path))["step"] == 6  # resumes
    if family == "splm":  # the data-derived surprisal travels with the checkpoint, never trained
        before, after = (load_run(str(tmp_path), step).params["buffers"]["surprisal"] for step in (4, 6))
        np.testing.assert_array_equal(after, before)
        assert after.std() > 0.1  # not a constant: the unigram's, by the test of the buffer itself


@pytest.mark.parametrize("chunk", [None, 4])
def test_gaussian_potential_reproduces_the_unchunked_reference(chunk, monkeypatch):
    """Values, forces and the training objective's gradient of every parameter equal the float64
    reference written by the first (unchunked, autodiff-backward) implementation: in one chunk, and
    in chunks of 2 slots × 2 rows (h: 4 chunks, the last one padded; the streams: 7 chunks)."""
    from rank4jax.models.splm import potential
    from tests.fixtures import make_splm_gaussian_reference as ref

    if chunk:
        monkeypatch.setattr(potential, "CHUNK_POSITIONS", chunk)

    path = os.path.join(os.path.dirname(ref.__file__), "splm_gaussian_reference.npz")
    stored = np.load(path)
    with jax.enable_x64(True):
        cfg = splm.SPLMConfig(**ref.SIZES)
        template = jax.eval_shape(lambda: splm.init_params(jax.random.key(0), cfg, jnp.float64))
        paths, treedef = jax.tree_util.tree_flatten_with_path(template)
        leaves = [jnp.asarray(stored["param/" + jax.tree_util.keystr(p)]) for p, _ in paths]
        params = jax.tree_util.tree_unflatten(treedef, leaves)
        assert any(0 < float(jnp.max(jnp.abs(x))) for x in leaves)
        now = ref.compute(params, cfg, jnp.asarray(stored["windows"]))
    assert set(now) == {k for k in stored.files if not k.startswith(("param/", "windows"))}
    for name, value in now.items():
        expected = stored[name]
        scale = max(float(np.max(np.abs(expected))), 1e-300)
        assert np.max(np.abs(value - expected)) <= 1e-12 * scale, name
    assert stored["grad/['potential']['w_a']"].any() and stored["grad/['potential']['depth']"].any()
