"""Composition of the rank-4 model (SPEC §2–§4): embedding → L Pre-LN layers → final LN → readout.

Axes: B batch, T input slices, N tokens per state, dx/dt fibers, D = dx·dt, P = N·T positions
(flattened as p = x·T + t; the joint softmax does not depend on this order), V vocabulary.

Parameter tree (nested dicts; shapes in SPEC §10 except the attention maps, kept as (H, D, D)):

    embed:   {sem (V, dx), tmp (V, dt)}
    readout: {tmp (V, dt)}                         W′
    layers:  [{ln_attn: {scale, bias} (dx, dt), attn: {wq, wk, wv} (H, D, D),
               ln_mlp: {scale, bias} (dx, dt), mlp: {w1 (D, 4D), b1 (4D,), w2 (4D, D), b2 (D,)}}] × L
    final_ln: {scale, bias} (dx, dt)

With a ZPX score (``cfg.zpx``, see ``rank4jax.models.zpx``) each layer also holds
``zpx: {w_r, w_theta, w_b (D, C), b_r, b_theta, b_b (C,)}``: its phase encoder reads the normalised
flattened fiber at every (x, t) and the angle (+ sphere) term joins every head's score over the joint
key grid, before the key mask.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from rank4jax.models import common
from rank4jax.models.common import PAD_ID, apply_mlp, dropout, init_layer_norm, init_mlp, layer_norm
from rank4jax.models.rank4.analytic import attention_block
from rank4jax.models.rank4.attention import apply_attention, attention_weights, init_attention, project_qkv
from rank4jax.models.rank4.config import Rank4Config
from rank4jax.models.rank4.embedding import apply_embedding, init_embedding
from rank4jax.models.rank4.readout import apply_readout, init_readout
from rank4jax.models.zpx import (
    center_cancellation,
    encode_phase,
    geometric_features,
    geometric_scores,
    init_phase_encoder,
)


def init_params(key: jax.Array, cfg: Rank4Config, dtype=jnp.float32) -> dict:
    """Initial parameters (SPEC §5). Use ``jax.eval_shape`` for shapes without allocating."""
    k_embed, k_readout, k_layers = jax.random.split(key, 3)
    fiber = (cfg.dx, cfg.dt)
    layers = []
    for layer_key in jax.random.split(k_layers, cfg.n_layers):
        k_attn, k_mlp = jax.random.split(layer_key)
        layer = {
            "ln_attn": init_layer_norm(fiber, dtype),
            "attn": init_attention(k_attn, cfg, dtype),
            "ln_mlp": init_layer_norm(fiber, dtype),
            "mlp": init_mlp(k_mlp, cfg.width, dtype),
        }
        if cfg.zpx.enabled:  # a key of its own, so the standard parameters do not change
            layer["zpx"] = init_phase_encoder(jax.random.fold_in(layer_key, 7), cfg.width, cfg.zpx.channels, dtype)
        layers.append(layer)
    return {
        "embed": init_embedding(k_embed, cfg, dtype),
        "readout": init_readout(k_readout, cfg.vocab_size, cfg.dt, cfg.width, dtype),
        "layers": layers,
        "final_ln": init_layer_norm(fiber, dtype),
    }


def key_padding_mask(inputs: jax.Array) -> jax.Array:
    """inputs (B, T, N) → key_mask (B, P) bool, True where the token is not PAD (p = x·T + t)."""
    return jnp.swapaxes(inputs, 1, 2).reshape(inputs.shape[0], -1) != PAD_ID


def zpx_scores(layer: dict, u: jax.Array, key_mask: jax.Array, cfg: Rank4Config) -> tuple[jax.Array, jax.Array]:
    """The ZPX score term (B, P, K) of one layer from its normalised stream u, and the layer's
    centre-cancellation value over the real positions."""
    phase = encode_phase(layer["zpx"], u, cfg.zpx.max_log_radius)
    query_features, key_features = geometric_features(phase, cfg.zpx)
    return geometric_scores(query_features, key_features), center_cancellation(phase, key_mask)


def apply_layer(
    layer: dict, x: jax.Array, key_mask: jax.Array, cfg: Rank4Config, *, train: bool, rng: jax.Array | None
) -> tuple[jax.Array, jax.Array]:
    """One Pre-LN layer on the stream x (B, P, D): attention branch then MLP branch. Returns the new
    stream and the layer's centre-cancellation value (0 without a ZPX score)."""
    rng_attn, rng_mlp = (None, None) if rng is None else jax.random.split(rng)
    center = jnp.zeros((), x.dtype)
    if cfg.attention == "analytic":  # same forward, §6 hand-derived backward
        attended = attention_block(x, layer["ln_attn"], layer["attn"], key_mask)
    else:
        u = layer_norm(x, layer["ln_attn"]["scale"], layer["ln_attn"]["bias"])
        extra = None
        if cfg.zpx.enabled:
            extra, center = zpx_scores(layer, u, key_mask, cfg)
        attended = apply_attention(layer["attn"], u, key_mask, cfg, extra)
    x = x + dropout(attended, cfg.dropout, rng_attn, train)
    u = layer_norm(x, layer["ln_mlp"]["scale"], layer["ln_mlp"]["bias"])
    return x + dropout(apply_mlp(layer["mlp"], u), cfg.dropout, rng_mlp, train), center


def _input_stream(params: dict, inputs: jax.Array, cfg: Rank4Config) -> tuple[jax.Array, jax.Array]:
    """inputs (B, T, N) → the embedded stream X (B, P, D) and the key mask (B, P), computed once per
    forward and shared by all layers."""
    tok = jnp.swapaxes(inputs, 1, 2)  # (B, N, T)
    x = apply_embedding(params["embed"], tok, cfg).reshape(inputs.shape[0], -1, cfg.width)
    return x, key_padding_mask(inputs)


def hidden_states_and_center(
    params: dict, inputs: jax.Array, cfg: Rank4Config, *, train: bool = False, rng: jax.Array | None = None
) -> tuple[jax.Array, jax.Array]:
    """inputs (B, T, N) int → (final-normed stream Y (B, P, D), mean over layers of the ZPX
    centre-cancellation value; 0 for the standard score)."""
    batch = inputs.shape[0]
    chex.assert_shape(inputs, (batch, cfg.n_slices, cfg.n_tokens))
    if train and cfg.dropout > 0.0 and rng is None:
        raise ValueError("forward(train=True) with dropout > 0 needs rng")
    x, key_mask = _input_stream(params, inputs, cfg)
    centers = []
    for index, layer in enumerate(params["layers"]):
        layer_rng = None if rng is None else jax.random.fold_in(rng, index)
        x, center = apply_layer(layer, x, key_mask, cfg, train=train, rng=layer_rng)
        centers.append(center)
    y = layer_norm(x, params["final_ln"]["scale"], params["final_ln"]["bias"])
    return y, jnp.mean(jnp.stack(centers))


def hidden_states(
    params: dict, inputs: jax.Array, cfg: Rank4Config, *, train: bool = False, rng: jax.Array | None = None
) -> jax.Array:
    """inputs (B, T, N) int → final-normed stream Y (B, P, D)."""
    return hidden_states_and_center(params, inputs, cfg, train=train, rng=rng)[0]


def attention_maps(params: dict, inputs: jax.Array, cfg: Rank4Config) -> list[jax.Array]:
    """Eval-mode attention weights of every layer, each (B, H, N, T, N, T): [b, h, x, t, x', t']."""
    batch = inputs.shape[0]
    x, key_mask = _input_stream(params, inputs, cfg)
    grid = (cfg.n_tokens, cfg.n_slices)
    maps = []
    for layer in params["layers"]:
        u = layer_norm(x, layer["ln_attn"]["scale"], layer["ln_attn"]["bias"])
        q, k, _ = project_qkv(layer["attn"], u)
        extra = zpx_scores(layer, u, key_mask, cfg)[0] if cfg.zpx.enabled else None
        maps.append(attention_weights(q, k, key_mask, extra).reshape((batch, cfg.n_heads) + grid + grid))
        x, _ = apply_layer(layer, x, key_mask, cfg, train=False, rng=None)
    return maps


def forward(
    params: dict, inputs: jax.Array, cfg: Rank4Config, *, train: bool = False, rng: jax.Array | None = None
) -> jax.Array:
    """inputs (B, T, N) int32 = S(0..T-1) → logits (B, N, T, V) (SPEC §11)."""
    batch = inputs.shape[0]
    y = hidden_states(params, inputs, cfg, train=train, rng=rng)
    logits = apply_readout(params["embed"]["sem"], params["readout"]["tmp"], y)
    logits = logits.reshape(batch, cfg.n_tokens, cfg.n_slices, cfg.vocab_size)
    chex.assert_shape(logits, (batch, cfg.n_tokens, cfg.n_slices, cfg.vocab_size))
    return logits


def next_state_logits(params: dict, inputs: jax.Array, cfg: Rank4Config) -> jax.Array:
    """Eval-mode logits of the next state S(T) only: (B, N, V), the slice t = T−1 of :func:`forward`.

    The readout, by far the costliest matmul at a word vocabulary, runs on the N positions of the
    last input slice instead of all P = N·T (what Story Cloze scoring, prediction and rollout need)."""
    batch = inputs.shape[0]
    y = hidden_states(params, inputs, cfg).reshape(batch, cfg.n_tokens, cfg.n_slices, cfg.width)[:, :, -1]
    logits = apply_readout(params["embed"]["sem"], params["readout"]["tmp"], y)
    chex.assert_shape(logits, (batch, cfg.n_tokens, cfg.vocab_size))
    return logits


def count_params(cfg: Rank4Config) -> int:
    """Parameter count from ``jax.eval_shape`` (nothing is allocated)."""
    return common.count_params(init_params, cfg)
