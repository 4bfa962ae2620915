"""rank4jax.nn: the Flax NNX modules are the functional model — the same initial parameters, the same
outputs and gradients bit for bit (float32 and float64, dropout off and on) — and building blocks a
model of one's own can train with (another grid, a classification head), through linen too."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import linen, nnx

import rank4jax
import rank4jax.nn as r4nn
from rank4jax.errors import ConfigError
from rank4jax.models.zpx import ZPXConfig
from tests.helpers import numpy_params

CFG = rank4jax.Rank4Config(vocab_size=11, n_tokens=3, n_slices=2, dx=2, dt=3, n_heads=2, n_layers=2, dropout=0.3)


def _inputs(batch=4):
    inputs = np.random.default_rng(0).integers(1, CFG.vocab_size, (batch, CFG.n_slices, CFG.n_tokens))
    inputs[0, :, 2] = 0  # a PAD column: masked keys
    inputs[1, 1, :] = 0
    return jnp.asarray(inputs, jnp.int32)


def _assert_trees_equal(got, want):
    chex.assert_trees_all_equal_structs(got, want)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), got, want)


def test_model_initialises_as_init_params():
    """Rank4Model(cfg, rngs=nnx.Rngs(0)) is init_params(nnx.Rngs(0).params(), cfg) (SPEC §5), exactly."""
    model = r4nn.Rank4Model(CFG, rngs=nnx.Rngs(0))
    _assert_trees_equal(model.to_params(), rank4jax.init_params(nnx.Rngs(0).params(), CFG))
    assert sum(p.size for p in jax.tree.leaves(nnx.state(model, nnx.Param))) == rank4jax.count_params(CFG)


def test_from_params_round_trip():
    params = numpy_params(rank4jax.init_params, CFG)
    model = r4nn.Rank4Model.from_params(params, CFG)
    _assert_trees_equal(model.to_params(), params)
    assert all(isinstance(v, nnx.Param) for v in jax.tree.leaves(nnx.state(model), is_leaf=_is_variable))


def _is_variable(v):
    return isinstance(v, nnx.Variable)


@pytest.mark.parametrize("x64", [False, True], ids=["float32", "float64"])
@pytest.mark.parametrize("train", [False, True], ids=["eval", "dropout"])
def test_outputs_and_gradients_equal_forward(x64, train):
    """The module's logits and its parameters' gradients equal rank4jax.forward's bit for bit (both
    jitted), with dropout off and on (the same key)."""
    with jax.enable_x64(x64):
        dtype = jnp.float64 if x64 else jnp.float32
        params = numpy_params(rank4jax.init_params, CFG, dtype)
        inputs, key = _inputs(), jax.random.key(3)
        model = r4nn.Rank4Model.from_params(params, CFG)
        model.train() if train else model.eval()

        def model_loss(model):
            logits = model(inputs, rng=key)
            return jnp.sum(jnp.sin(logits)), logits

        def functional_loss(params):
            logits = rank4jax.forward(params, inputs, CFG, train=train, rng=key)
            return jnp.sum(jnp.sin(logits)), logits

        (_, got), grads = nnx.jit(nnx.value_and_grad(model_loss, has_aux=True))(model)
        (_, want), want_grads = jax.jit(jax.value_and_grad(functional_loss, has_aux=True))(params)
        assert got.dtype == dtype and got.shape == (4, CFG.n_tokens, CFG.n_slices, CFG.vocab_size)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        holder = r4nn.Rank4Model.from_params(jax.tree.map(jnp.zeros_like, params), CFG)
        nnx.update(holder, grads)
        _assert_trees_equal(holder.to_params(), want_grads)
        if train:  # dropout really ran
            assert not np.array_equal(np.asarray(got), np.asarray(rank4jax.forward(params, inputs, CFG)))


def test_variants_are_constructor_arguments():
    """The §6 analytic backward and a score variant (ZPX, its own parameters in each block) are composed
    in by the config: same outputs as the functional forward, parameters round-trip."""
    zpx = dataclasses.replace(CFG, dropout=0.0, score=ZPXConfig(score="zpx_angle", channels=2))
    analytic = dataclasses.replace(CFG, dropout=0.0, attention="analytic")
    inputs = _inputs()
    for cfg in (zpx, analytic):
        params = numpy_params(rank4jax.init_params, cfg)
        model = r4nn.Rank4Model.from_params(params, cfg)
        _assert_trees_equal(model.to_params(), params)
        np.testing.assert_array_equal(np.asarray(model(inputs)), np.asarray(rank4jax.forward(params, inputs, cfg)))
    assert set(nnx.state(r4nn.Rank4Model(zpx, rngs=nnx.Rngs(0)).layers[0].score)) == {
        "w_r", "b_r", "w_theta", "b_theta", "w_b", "b_b"
    }  # fmt: skip


def test_attention_exact_on_a_tiny_grid():
    """With WQ = WK = 0 every score is 0: each query's weights are uniform over the unmasked keys, so
    the output is Σ_h mean of V_h over them, on any grid (here 2 × 3 of (1, 2) fibers)."""
    with jax.enable_x64(True):
        x = jnp.asarray(np.random.default_rng(1).standard_normal((1, 2, 3, 1, 2)))
        mask = jnp.asarray([[[True, False, True], [True, True, False]]])
        wv = jnp.asarray([[[1.0, 2.0], [0.0, 1.0]], [[0.5, 0.0], [0.0, -1.0]]])  # (H=2, D=2, D=2)
        params = {"wq": jnp.zeros_like(wv), "wk": jnp.zeros_like(wv), "wv": wv}
        out = rank4jax.rank4_attention(params, x, mask)
        keys = np.asarray(x).reshape(6, 2)[np.asarray(mask).reshape(6)]
        expected = keys.mean(axis=0) @ np.asarray(wv[0]) + keys.mean(axis=0) @ np.asarray(wv[1])
        np.testing.assert_allclose(np.asarray(out).reshape(6, 2), np.tile(expected, (6, 1)), rtol=0, atol=1e-15)
        module = r4nn.Rank4Attention(1, 2, 2, params=params)
        np.testing.assert_array_equal(np.asarray(module(x, mask)), np.asarray(out))
        weights = np.asarray(module.weights(x, mask))  # (B, H, 2, 3, 2, 3)
        np.testing.assert_allclose(weights[0, 1, 1, 2], np.asarray(mask[0]) / 4.0, rtol=0, atol=1e-15)


def test_shape_checks_at_the_boundary():
    block = r4nn.Rank4Block(2, 3, 2, rngs=nnx.Rngs(0))
    with pytest.raises(AssertionError):
        block(jnp.zeros((1, 4, 3, 2)), jnp.ones((1, 4), bool))  # fibers (3, 2), not (2, 3)
    with pytest.raises(AssertionError):
        block(jnp.zeros((1, 4, 2, 3)), jnp.ones((1, 5), bool))  # a key mask of another grid
    with pytest.raises(AssertionError):
        r4nn.Rank4Model(CFG, rngs=nnx.Rngs(0))(jnp.zeros((1, CFG.n_tokens, CFG.n_slices), jnp.int32))  # (B, N, T)
    with pytest.raises(ValueError, match="needs rng"):
        block.train()
        block(jnp.zeros((1, 4, 2, 3)), jnp.ones((1, 4), bool))


class GridClassifier(nnx.Module):
    """A model of one's own: a 3 × 5 grid of tokens ("frames × patches"), embedded to (dx, dt) fibers
    with learned positions, two rank-4 blocks, mean pooling, a linear head over 4 classes."""

    def __init__(self, rngs: nnx.Rngs, vocab=4, dx=4, dt=2):
        self.fiber = (dx, dt)
        self.embed = nnx.Embed(vocab, dx * dt, rngs=rngs)
        self.position = nnx.Param(0.1 * jax.random.normal(rngs.params(), (3, 5, dx * dt)))
        self.blocks = nnx.List([r4nn.Rank4Block(dx, dt, 2, dropout=0.0, rngs=rngs) for _ in range(2)])
        self.norm = r4nn.FiberLayerNorm(dx, dt)
        self.head = nnx.Linear(dx * dt, 4, rngs=rngs)

    def __call__(self, tokens):  # (B, 3, 5) → (B, 4)
        x = (self.embed(tokens) + self.position[...]).reshape(tokens.shape + self.fiber)  # (B, 3, 5, dx, dt)
        mask = jnp.ones(tokens.shape, bool)
        for block in self.blocks:
            x = block(x, mask)
        pooled = jnp.mean(self.norm(x), axis=(1, 2))  # (B, dx, dt)
        return self.head(pooled.reshape(tokens.shape[0], -1))


def test_custom_model_trains_with_nnx_optimizer():
    """The class is the token in cell (0, 0) — readable from the pooled grid only by attending to that
    cell. adamw under nnx.jit takes the cross-entropy from log 4 = 1.386 to below 0.05."""
    model = GridClassifier(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adamw(1e-2), wrt=nnx.Param)
    tokens = jax.random.randint(jax.random.key(1), (256, 3, 5), 0, 4)
    labels = tokens[:, 0, 0]

    @nnx.jit
    def step(model, optimizer):
        def loss_fn(model):
            return optax.softmax_cross_entropy_with_integer_labels(model(tokens), labels).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    losses = [float(step(model, optimizer)) for _ in range(150)]
    assert losses[0] > 1.0
    assert losses[-1] < 0.05, losses[-10:]


def test_linen_model_through_to_linen():
    """A linen model holds the rank-4 attention through nnx.bridge.ToLinen: its outputs are the
    functional attention's on the same parameters."""

    class LinenModel(linen.Module):
        @linen.compact
        def __call__(self, x, mask):
            return nnx.bridge.ToLinen(r4nn.Rank4Attention, args=(2, 3, 2), name="attn")(x, mask)

    x = jax.random.normal(jax.random.key(0), (2, 4, 5, 2, 3))
    mask = jnp.ones((2, 4, 5), bool).at[0, 3].set(False)
    variables = LinenModel().init(jax.random.key(1), x, mask)
    params = variables["params"]["attn"]  # {wq, wk, wv}: plain arrays
    assert set(params) == {"wq", "wk", "wv"} and params["wq"].shape == (2, 6, 6)
    got = LinenModel().apply(variables, x, mask)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(rank4jax.rank4_attention(params, x, mask)))


def test_orbax_saves_and_restores_module_state(tmp_path):
    """As flax's docs show: save nnx.state, restore onto nnx.eval_shape's abstract state, nnx.merge."""
    model = r4nn.Rank4Model(CFG, rngs=nnx.Rngs(5))
    _, state = nnx.split(model)
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(tmp_path / "state", state)
        checkpointer.wait_until_finished()
        abstract = nnx.eval_shape(lambda: r4nn.Rank4Model(CFG, rngs=nnx.Rngs(0)))
        graphdef, abstract_state = nnx.split(abstract)
        restored = nnx.merge(graphdef, checkpointer.restore(tmp_path / "state", abstract_state))
    _assert_trees_equal(restored.to_params(), model.to_params())
    inputs = _inputs()
    np.testing.assert_array_equal(np.asarray(restored(inputs)), np.asarray(model(inputs)))


def test_from_run(tiny_run):
    run = rank4jax.load_run(str(tiny_run))
    model = r4nn.from_run(run)
    inputs = jnp.ones((2, run.model_cfg.n_slices, run.model_cfg.n_tokens), jnp.int32)
    np.testing.assert_array_equal(
        np.asarray(model(inputs)), np.asarray(rank4jax.forward(run.params, inputs, run.model_cfg))
    )


def test_from_run_refuses_another_family(tiny_baseline_run):
    with pytest.raises(ConfigError, match="takes a rank-4 run; this run's family is baseline"):
        r4nn.from_run(rank4jax.load_run(str(tiny_baseline_run)))
