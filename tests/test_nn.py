"""rank4jax.nn: the Flax NNX modules are the functional model — the same initial parameters, the same
outputs and gradients bit for bit (float32 and float64, dropout off and on, bfloat16 as the trainer
computes it) — with flax's habits (rngs streams, train/eval, dtype, masks, sow, sharding metadata,
clear errors), and building blocks a model of one's own trains with (another grid, a classification
head, continuous inputs), through linen too."""

import dataclasses
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen, nnx

import rank4jax
import rank4jax.nn as r4nn
from rank4jax.errors import ConfigError
from rank4jax.models.zpx import ZPXConfig
from tests.helpers import jitted_forward, numpy_params

PRODUCT_COMPILE = {"xla_backend_optimization_level": 2, "xla_cpu_use_fusion_emitters": True}  # XLA's defaults
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


@pytest.mark.parametrize("train,x64", [(False, True), (True, False)], ids=["eval-float64", "dropout-float32"])
def test_outputs_and_gradients_equal_forward(train, x64):
    """The module's logits and its parameters' gradients equal rank4jax.forward's bit for bit (both
    jitted): after .eval() its eval mode; in training mode (the default) with a dropout key,
    forward(train=True, rng=that key). Without a key at the call the key is the next of the model's
    own dropout stream, and the stream moves on. Two of the four (mode, dtype) pairs, each mode and
    each dtype once: the dtype is the parameters' and flows through either mode alike, and each pair is
    a level-2 compile of about 7 s."""
    with jax.enable_x64(x64):
        dtype = jnp.float64 if x64 else jnp.float32
        params = numpy_params(rank4jax.init_params, CFG, dtype)
        inputs = _inputs()
        model = r4nn.Rank4Model.from_params(params, CFG, rngs=nnx.Rngs(params=0, dropout=1))
        assert model.deterministic is False  # flax's modules start in training mode
        if not train:
            model.eval()

        def model_loss(model, key):
            logits = model(inputs, rngs=key)
            return jnp.sum(jnp.sin(logits)), logits

        def functional_loss(params, key):
            logits = rank4jax.forward(params, inputs, CFG, train=train, rng=key)
            return jnp.sum(jnp.sin(logits)), logits

        # both in one program compiled as the product compiles (XLA:CPU at level 2): the suite's level 0
        # (conftest) can round two different computations of the same arithmetic differently in the last bit
        graphdef, state = nnx.split(model)

        def both(state, params, key):
            module = nnx.value_and_grad(model_loss, has_aux=True)(nnx.merge(graphdef, state), key)
            return module, jax.value_and_grad(functional_loss, has_aux=True)(params, key)

        key = nnx.clone(model.rngs)()  # the next key of the model's stream
        ((_, got), grads), ((_, want), want_grads) = jax.jit(both, compiler_options=PRODUCT_COMPILE)(state, params, key)
        assert got.dtype == dtype and got.shape == (4, CFG.n_tokens, CFG.n_slices, CFG.vocab_size)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        holder = r4nn.Rank4Model.from_params(jax.tree.map(jnp.zeros_like, params), CFG)
        nnx.update(holder, grads)
        _assert_trees_equal(holder.to_params(), want_grads)
        if train:  # dropout ran; the stream draws that key, then another
            assert not np.array_equal(np.asarray(got), np.asarray(jitted_forward(params, inputs, CFG)))
            call = nnx.jit(lambda model, key: model(inputs, rngs=key))
            first, second = call(model, None), call(model, None)  # no key: the stream's
            np.testing.assert_array_equal(np.asarray(first), np.asarray(call(model, key)))
            assert not np.array_equal(np.asarray(first), np.asarray(second))


def test_bfloat16_computes_as_the_trainer_does():
    """dtype=bfloat16 over float32 parameters: the trainer's compute_dtype policy (its parameters cast,
    then the functions), bit for bit; dtype=None promotes as flax does (float32 parameters, bfloat16
    input: float32)."""
    from rank4jax.models.precision import cast_to_compute

    params, inputs = numpy_params(rank4jax.init_params, CFG), _inputs()
    model = r4nn.Rank4Model.from_params(params, CFG, dtype=jnp.bfloat16, deterministic=True)
    want = jax.jit(lambda p: rank4jax.forward(cast_to_compute(p, "bfloat16"), inputs, CFG))(params)
    got = nnx.jit(lambda m: m(inputs))(model)
    assert got.dtype == want.dtype == jnp.float32  # the logits in float32, as the trainer's
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_the_block_is_attention_over_the_flattened_grid():
    """What the block is: on a (6, 8) grid of (4, 4) fibers it gives exactly its output on a flat 48-cell
    grid of (16, 1) fibers (the same maps, the LayerNorms reshaped): every map is dense over the whole
    fiber, the norms and the MLP run on the flattened fiber, and the one softmax ignores where a cell
    sits. The rank-4 structure is in the token code, the position codes and the readout (float64)."""
    with jax.enable_x64(True):
        layer = numpy_params(lambda key, cfg, dtype: rank4jax.init_layer(key, 4, 4, 2, dtype=dtype), None, np.float64)
        flat = jax.tree.map(lambda a: a.reshape(16, 1) if a.shape == (4, 4) else a, layer)
        x = jnp.asarray(np.random.default_rng(2).standard_normal((2, 6, 8, 4, 4)))
        mask = jnp.asarray(np.random.default_rng(3).random((2, 6, 8)) > 0.2)
        on_grid = rank4jax.rank4_block(layer, x, mask)
        on_cells = rank4jax.rank4_block(flat, x.reshape(2, 48, 16, 1), mask.reshape(2, 48))
        np.testing.assert_array_equal(np.asarray(on_grid).reshape(-1), np.asarray(on_cells).reshape(-1))
        block = r4nn.Rank4Block(4, 4, 2, params=layer, deterministic=True)
        np.testing.assert_array_equal(np.asarray(block(x, mask)), np.asarray(on_grid))
    assert 3 * 4 * 2048**2 == 50_331_648  # the paper's D = 64·32, H = 4: 50M attention parameters a layer


def test_block_dropout_from_its_own_stream_and_the_modes():
    """Dropout keys come from the block's rngs.dropout stream (no key argument), one per call; .eval(),
    deterministic=True and nnx.view turn it off; a legacy PRNGKey at the call is the typed key's data."""
    layer = numpy_params(lambda key, cfg, dtype: rank4jax.init_layer(key, 2, 3, 2, dtype=dtype), None)
    x = jnp.asarray(np.random.default_rng(4).standard_normal((3, 4, 5, 2, 3)), jnp.float32)
    block = r4nn.Rank4Block(2, 3, 2, dropout=0.3, params=layer, rngs=nnx.Rngs(params=0, dropout=1))
    key = nnx.clone(block.rngs)()
    first, second = block(x), block(x)
    want = rank4jax.rank4_block(layer, x, jnp.ones(x.shape[:3], bool), dropout=0.3, train=True, rng=key)
    np.testing.assert_array_equal(np.asarray(first), np.asarray(want))
    assert not np.array_equal(np.asarray(first), np.asarray(second))
    eval_out = rank4jax.rank4_block(layer, x, jnp.ones(x.shape[:3], bool))
    np.testing.assert_array_equal(np.asarray(block(x, deterministic=True)), np.asarray(eval_out))
    np.testing.assert_array_equal(np.asarray(nnx.view(block, deterministic=True)(x)), np.asarray(eval_out))
    block.eval()
    assert block.deterministic is True
    np.testing.assert_array_equal(np.asarray(block(x)), np.asarray(eval_out))
    block.train()
    legacy, typed = block(x, rngs=jax.random.PRNGKey(7)), block(x, rngs=jax.random.key(7))
    np.testing.assert_array_equal(np.asarray(legacy), np.asarray(typed))
    unseeded = r4nn.Rank4Block(2, 3, 2, dropout=0.3, params=layer)
    with pytest.raises(ValueError, match="needs a dropout stream: build it with rngs=nnx.Rngs"):
        unseeded(x)


def test_masks_broadcast_causal_extra_and_sown_weights():
    """mask None = every cell a key; a (1, *grid) or (*grid) mask broadcasts; is_causal hides the keys
    after a query along the causal axis (the stories' slices by default); an extra score of the finite
    minimum on a key is that key masked; the weights are sown as nnx.Intermediate."""
    with jax.enable_x64(True):
        attn = r4nn.Rank4Attention(2, 3, 2, rngs=nnx.Rngs(0), param_dtype=jnp.float64)
        x = jnp.asarray(np.random.default_rng(5).standard_normal((2, 3, 4, 2, 3)))
        full = attn(x, jnp.ones((2, 3, 4), bool))
        np.testing.assert_array_equal(np.asarray(attn(x)), np.asarray(full))
        partial = np.ones((3, 4), bool)
        partial[1, 2] = False
        got = attn(x, jnp.asarray(partial)[None])
        np.testing.assert_array_equal(np.asarray(got), np.asarray(attn(x, jnp.asarray(partial))))
        np.testing.assert_array_equal(np.asarray(got), np.asarray(attn(x, jnp.broadcast_to(partial, (2, 3, 4)))))
        weights = np.asarray(attn.weights(x, is_causal=True))  # (B, H, 3, 4, 3, 4)
        later = np.arange(4)[None, :, None, None] > np.arange(4)[None, None, None, :]  # key slice after the query's
        later = np.broadcast_to(np.arange(4)[None, None, None, :] > np.arange(4)[None, :, None, None], (3, 4, 3, 4))
        assert np.abs(weights[:, :, later]).max() == 0.0 and np.abs(weights[:, :, ~later]).min() > 0.0
        np.testing.assert_allclose(weights.sum(axis=(-2, -1)), 1.0, rtol=1e-14)
        by_rows = np.asarray(
            r4nn.Rank4Attention(2, 3, 2, causal_axis=0, params=attn.to_params()).weights(x, is_causal=True)
        )
        below = np.broadcast_to(np.arange(3)[None, None, :, None] > np.arange(3)[:, None, None, None], (3, 4, 3, 4))
        assert np.abs(by_rows[:, :, below]).max() == 0.0
        minimum = jnp.finfo(jnp.float64).min
        extra = jnp.where(jnp.asarray(partial).reshape(1, 1, 12), 0.0, minimum) * jnp.ones((2, 12, 12))
        np.testing.assert_allclose(
            np.asarray(attn.weights(x, extra=extra)),
            np.asarray(attn.weights(x, jnp.asarray(partial))),
            rtol=0,
            atol=1e-15,
        )
        block = r4nn.Rank4Block(2, 3, 2, deterministic=True, param_dtype=jnp.float64, rngs=nnx.Rngs(1))
        out, sown = nnx.capture(block, nnx.Intermediate)(x, extra=extra, sow_weights=True)
        sown = sown["attn"]["attention_weights"].get_value()[0]  # (B, H, *grid, *grid)
        np.testing.assert_array_equal(np.asarray(sown), np.asarray(block.attn.weights(block.ln_attn(x), extra=extra)))
        np.testing.assert_array_equal(np.asarray(out), np.asarray(block(x, jnp.asarray(partial))))


def test_initialisers_and_constructor_errors():
    block = r4nn.Rank4Block(2, 3, 2, kernel_init=nnx.initializers.zeros, rngs=nnx.Rngs(0))
    assert float(jnp.abs(block.attn.wq[...]).max()) == 0.0 and float(jnp.abs(block.mlp.w2[...]).max()) == 0.0
    default = r4nn.Rank4Block(2, 3, 2, rngs=nnx.Rngs(0))
    _assert_trees_equal(default.to_params(), rank4jax.init_layer(nnx.Rngs(0).params(), 2, 3, 2))
    for kwargs, message in (
        ({"dropout": 2.0}, "Rank4Block: dropout must be"),
        ({"dropout": -1.0}, "Rank4Block: dropout must be"),
        ({"attention": "bogus"}, "attention must be one of"),
    ):
        with pytest.raises((ValueError, ConfigError), match=message):
            r4nn.Rank4Block(2, 3, 2, rngs=nnx.Rngs(0), **kwargs)
    with pytest.raises(ConfigError, match="Rank4Block: n_heads must be a positive integer"):
        r4nn.Rank4Block(2, 3, 0, rngs=nnx.Rngs(0))
    with pytest.raises(ConfigError, match="Rank4Attention: dx must be a positive integer"):
        r4nn.Rank4Attention(0, 3, 2, rngs=nnx.Rngs(0))


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


def test_shape_and_dtype_errors_name_the_argument():
    block = r4nn.Rank4Block(2, 3, 2, rngs=nnx.Rngs(0))
    x = jnp.zeros((1, 4, 2, 3))
    cases = (
        (lambda: block(jnp.zeros((4, 2, 3))),
         "x must be (B, *grid, dx, dt) = (B, ..., 2, 3) with at least one grid axis, got shape (4, 2, 3)"),
        (lambda: block(jnp.zeros((1, 4, 3, 2))), "x's fibers must be (dx, dt) = (2, 3), got (3, 2)"),
        (lambda: block(x.astype(jnp.int32)), "x must be floating, got int32"),
        (lambda: block(x, jnp.ones((1, 5), bool)), "mask of shape (1, 5) does not broadcast to (B, *grid) = (1, 4)"),
        (lambda: block(x, jnp.ones((1, 4))), "mask must be bool"),
        (lambda: block(x, extra=jnp.zeros((1, 4, 5))), "extra must be a score term (B, P, K) = (1, 4, 4)"),
        (lambda: r4nn.Rank4Model(CFG, rngs=nnx.Rngs(0))(jnp.zeros((1, CFG.n_tokens, CFG.n_slices), jnp.int32)),
         "inputs must be token ids (B, T, N) = (B, 2, 3)"),
    )  # fmt: skip
    for call, message in cases:
        with pytest.raises(ValueError, match=re.escape(message)):
            call()


def test_a_loss_on_the_targets_order():
    """slices_first gives (B, T, N, V), the order of the targets S(1..T), so an optax loss takes them as
    they come; window_losses names the order when targets arrive as (B, N, T)."""
    model = r4nn.Rank4Model(CFG, rngs=nnx.Rngs(0), deterministic=True)
    inputs = _inputs()
    targets = jnp.roll(inputs, -1, axis=1)  # (B, T, N)
    per_token = optax.softmax_cross_entropy_with_integer_labels(model(inputs, slices_first=True), targets)
    swapped = optax.softmax_cross_entropy_with_integer_labels(model(inputs), jnp.swapaxes(targets, 1, 2))
    np.testing.assert_array_equal(np.asarray(per_token), np.asarray(jnp.swapaxes(swapped, 1, 2)))
    with pytest.raises(
        ValueError, match=r"targets must be \(B, T, N\) = \(4, 2, 3\).*got \(4, 3, 2\): in the logits' order"
    ):
        rank4jax.window_losses(model(inputs), jnp.swapaxes(targets, 1, 2))


def test_the_readme_optax_loss_is_window_ce_on_a_real_story(tiny_run):
    """README's optax loss (PAD targets masked) on a built-in story through the trained tiny run is
    rank4jax.window_losses' window CE; counting the PAD targets, as an unmasked mean does, is not."""
    from rank4jax.data.corpus import generate_stories
    from rank4jax.data.windows import encode_story

    run = rank4jax.load_run(str(tiny_run))
    cfg = run.model_cfg
    story = generate_stories(1, seed=3)[0].sentences[: cfg.n_slices + 1]
    window = jnp.asarray(encode_story(run.tokenizer, story, cfg.n_tokens))[None]  # (1, T+1, N)
    inputs, targets = window[:, :-1], window[:, 1:]
    model = r4nn.from_run(run)
    per_token = optax.softmax_cross_entropy_with_integer_labels(model(inputs, slices_first=True), targets)  # (B, T, N)
    loss = jnp.sum(per_token * (targets != 0)) / jnp.sum(targets != 0)  # PAD (id 0) targets carry no loss
    want = rank4jax.window_losses(rank4jax.forward(run.params, inputs, cfg), targets)["window_ce"]
    assert int(jnp.sum(targets == 0)) > 0
    np.testing.assert_allclose(float(loss), float(want), rtol=1e-6)
    assert abs(float(jnp.mean(per_token)) - float(want)) > 1e-3  # the PAD targets, counted


def test_position_codes_are_the_embeddings():
    """position_codes((N, T), dx, dt) is what Rank4Embedding adds to the stories' tokens: the embedding of
    an all-PAD window (PAD rows are zero), exactly; (N,) is the (N, 1) grid's; other ranks are refused."""
    codes = r4nn.position_codes((CFG.n_tokens, CFG.n_slices), CFG.dx, CFG.dt)
    embed = r4nn.Rank4Embedding(CFG, rngs=nnx.Rngs(0))
    pad = embed(jnp.zeros((1, CFG.n_slices, CFG.n_tokens), jnp.int32))[0]
    np.testing.assert_array_equal(np.asarray(codes), np.asarray(pad))
    line = r4nn.position_codes((5,), 2, 3)
    assert line.shape == (5, 2, 3)
    np.testing.assert_array_equal(np.asarray(line), np.asarray(r4nn.position_codes((5, 1), 2, 3)[:, 0]))
    with pytest.raises(ValueError, match=r"position_codes: grid must be \(N, T\) or \(N,\), .*got \(6, 8, 2\)"):
        r4nn.position_codes((6, 8, 2), 2, 3)


def test_causal_along_the_axis_the_call_names():
    """On a clip (B, frames, patches, dx, dt), is_causal with causal_axis=0 at the call orders the frames:
    frames 0-3 do not change when frames 4-5 do (the module's default, the last axis, orders the
    patches); the call's axis is the module's when built with it; an axis the grid lacks is refused."""
    block = r4nn.Rank4Block(2, 3, 2, dropout=0.0, rngs=nnx.Rngs(0))
    clip = jnp.asarray(np.random.default_rng(6).standard_normal((1, 6, 8, 2, 3)), jnp.float32)
    later = clip.at[:, 4:].multiply(-2.0)  # frames 4-5 changed (a constant shift would vanish in the LayerNorm)
    by_frames = block(clip, is_causal=True, causal_axis=0), block(later, is_causal=True, causal_axis=0)
    np.testing.assert_array_equal(np.asarray(by_frames[0][:, :4]), np.asarray(by_frames[1][:, :4]))
    by_patches = block(clip, is_causal=True), block(later, is_causal=True)
    assert np.abs(np.asarray(by_patches[0][:, :4]) - np.asarray(by_patches[1][:, :4])).max() > 0.1
    built = r4nn.Rank4Block(2, 3, 2, dropout=0.0, causal_axis=0, params=block.to_params())
    np.testing.assert_array_equal(np.asarray(built(clip, is_causal=True)), np.asarray(by_frames[0]))
    with pytest.raises(ValueError, match=r"causal_axis=2 is not an axis of the 2-axis grid \(6, 8\)"):
        block(clip, is_causal=True, causal_axis=2)


def test_pairwise_masks_as_flax_takes_them():
    """A pairwise bool mask (B, P, K), or one per head (B, H, P, K), over the cells in C order: the causal
    one gives is_causal's weights; per head, each head its own."""
    attn = r4nn.Rank4Attention(2, 3, 2, rngs=nnx.Rngs(0))
    x = jnp.asarray(np.random.default_rng(7).standard_normal((2, 3, 4, 2, 3)), jnp.float32)
    order = np.arange(12).reshape(3, 4) % 4  # each cell's slice t (the last grid axis)
    causal = jnp.asarray(order.reshape(-1)[None, :] <= order.reshape(-1)[:, None])  # (P, K)
    want = attn.weights(x, is_causal=True)
    np.testing.assert_array_equal(np.asarray(attn.weights(x, causal[None])), np.asarray(want))
    per_head = jnp.stack([jnp.ones((12, 12), bool), causal])[None]  # (1, H, P, K): head 0 sees every key
    got = np.asarray(attn.weights(x, per_head))
    np.testing.assert_array_equal(got[:, 1], np.asarray(want)[:, 1])
    np.testing.assert_array_equal(got[:, 0], np.asarray(attn.weights(x))[:, 0])
    with pytest.raises(ValueError, match=r"a per-head mask \(B, H, P, K\) has 3 heads; the attention has 2"):
        attn(x, jnp.ones((1, 3, 12, 12), bool))


def test_each_module_returns_its_compute_dtype():
    """The dtype rule: every module computes in, and returns, its compute dtype (``dtype``, else the
    promotion of its input and parameters); the model's logits are float32 or wider, for the CE."""
    f32, bf16 = jnp.ones((1, 4, 2, 3), jnp.float32), jnp.ones((1, 4, 2, 3), jnp.bfloat16)
    for make in (
        lambda **o: r4nn.Rank4Block(2, 3, 2, dropout=0.0, rngs=nnx.Rngs(0), **o),
        lambda **o: r4nn.Rank4Attention(2, 3, 2, rngs=nnx.Rngs(0), **o),
        lambda **o: r4nn.Rank4MLP(2, 3, rngs=nnx.Rngs(0), **o),
        lambda **o: r4nn.FiberLayerNorm(2, 3, **o),
    ):
        assert make(dtype=jnp.bfloat16)(f32).dtype == jnp.bfloat16
        assert make()(bf16).dtype == make()(f32).dtype == jnp.float32
    model = r4nn.Rank4Model(CFG, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    assert model(_inputs()).dtype == jnp.float32


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
    params = linen.unbox(variables["params"]["attn"])  # {wq, wk, wv}, boxed with their partition names
    assert set(params) == {"wq", "wk", "wv"} and params["wq"].shape == (2, 6, 6)
    got = LinenModel().apply(variables, x, mask)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(rank4jax.rank4_attention(params, x, mask)))


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


def test_a_query_without_keys_gets_nothing():
    """A query with no allowed key (its slice masked, under is_causal) gets zero weights and a zero
    output: nothing from masked cells nor from later slices (changing them leaves it at zero)."""
    attn = r4nn.Rank4Attention(4, 2, 2, rngs=nnx.Rngs(0))
    x = jnp.asarray(np.random.default_rng(8).standard_normal((1, 3, 5, 4, 2)), jnp.float32)
    mask = jnp.ones((1, 3, 5), bool).at[:, :, 0].set(False)  # slice 0 holds no key
    weights = np.asarray(attn.weights(x, mask, is_causal=True))
    assert np.all(weights[:, :, :, 0] == 0.0) and np.abs(weights[:, :, :, 1:].sum(axis=(-2, -1)) - 1).max() < 1e-6
    later = x.at[:, :, 4].multiply(-3.0)
    for inputs in (x, later):
        np.testing.assert_array_equal(np.asarray(attn(inputs, mask, is_causal=True)[:, :, 0]), 0.0)
    np.testing.assert_array_equal(np.asarray(attn(x, jnp.zeros((1, 3, 5), bool))), 0.0)
