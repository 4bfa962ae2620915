"""The Pre-LN layer of the rank-4 model (SPEC §3–§4) and its attention sublayers.

Axes: B windows, G groups and R rows of a layout (``rank4jax.models.rank4.layout``; for full or
trimmed windows G = B and R = P, the rows are the grid), P = N·T query and K key positions of a
window's joint grid, H heads, D = dx·dt.

    x ← x + Dropout(Attn(LN_attn(x)))
    x ← x + Dropout(MLP(LN_mlp(x)))

The attention sublayer (LN_attn then the heads) is a function the layer receives, composed once per
forward (:func:`attention_sublayer`): :func:`autodiff_attention` (the paper's score, or a score variant's term
added to it, differentiated by autodiff) or :func:`analytic_attention` (SPEC §6's hand-derived
backward as a custom VJP). Layout moves (compact rows to the windows' grid and back) sit around
the attention heads, never inside them.
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp

from rank4jax.models import common, scores
from rank4jax.models.common import apply_mlp, fan_in_uniform, init_layer_norm, init_mlp, layer_norm
from rank4jax.models.rank4.analytic import attention_block
from rank4jax.models.rank4.attention import attention_heads, init_attention
from rank4jax.models.rank4.layout import Rows


def init_layer(
    key: jax.Array, dx: int, dt: int, n_heads: int, score=scores.STANDARD, dtype=jnp.float32, kernel_init=fan_in_uniform
) -> dict:
    """One layer's parameters (SPEC §5): LayerNorms at 1 and 0, the (H, D, D) attention maps and the
    MLP's weights by ``kernel_init`` (U(±1/sqrt(fan_in))), the score variant's entry from a key of its own."""
    k_attn, k_mlp = jax.random.split(key)
    layer = {
        "ln_attn": init_layer_norm((dx, dt), dtype),
        "attn": init_attention(k_attn, n_heads, dx * dt, dtype, kernel_init),
        "ln_mlp": init_layer_norm((dx, dt), dtype),
        "mlp": init_mlp(k_mlp, dx * dt, dtype, kernel_init),
    }
    return layer | scores.init_layer_params(score, key, dx * dt, dtype)


def autodiff_attention(
    layer: dict, x: jax.Array, key_mask: jax.Array, *, score=scores.STANDARD, rows=None, heads=attention_heads
):
    """LN_attn, then rank-4 attention with the score variant's term (``score``; the paper's adds none).
    x (G, R, D) → (Σ_h O_h (G, R, D), the variant's auxiliary value, the weights A (B, H, P, K)).
    ``rows`` (a :class:`Rows`) moves the normalised rows to the windows' grid and back; None: the rows
    are the grid. ``heads``: the heads over the grid (the paper's joint softmax, or
    ``rank4jax.models.rank4.axial``'s two hops)."""
    u = layer_norm(x, layer["ln_attn"]["scale"], layer["ln_attn"]["bias"])  # U = LN_attn(x)  (G, R, D)
    u = u if rows is None else rows.to_grid(u)  # on the windows' grid  (B, P, D)
    extra, aux = score.scores(scores.layer_params(score, layer), u, key_mask)  # (B, P, K) or None
    out, tensors = heads(layer["attn"], u, key_mask, extra)  # Σ_h O_h  (B, P, D)
    out = out if rows is None else rows.from_grid(out)  # back on the rows  (G, R, D)
    return out, aux, tensors["weights"]


def analytic_attention(layer: dict, x: jax.Array, key_mask: jax.Array, *, rows=None):
    """LN_attn, then rank-4 attention, with SPEC §6's hand-derived backward (the paper's score only):
    x (B, P, D) on full or trimmed windows → (Σ_h O_h (B, P, D), a zero auxiliary value, no weights)."""
    if rows is not None and rows.grid is not None:
        raise ValueError("the analytic (§6) backward runs on full or trimmed windows only")
    return attention_block(x, layer["ln_attn"], layer["attn"], key_mask), jnp.zeros((), x.dtype), None


def attention_sublayer(mode: str, score=scores.STANDARD, rows: Rows | None = None, heads=attention_heads):
    """The attention sublayer ``attention(layer, x, key_mask)`` of ``mode`` ("autodiff" | "analytic"),
    composed once with its score variant, the batch's layout and the heads over the grid (``heads``:
    ``Rank4Config.grid_heads``; the analytic backward is the joint softmax's)."""
    if mode == "analytic":
        return functools.partial(analytic_attention, rows=rows)
    return functools.partial(autodiff_attention, score=score, rows=rows, heads=heads)


def pre_ln_block(layer: dict, x: jax.Array, key_mask: jax.Array, *, attention, dropout, rng):
    """One Pre-LN layer on the stream x (G, R, D). ``attention(layer, x, key_mask)``: the sublayer
    (:func:`attention_sublayer`); ``dropout(y, keys)``: the layout's dropout of a branch; ``rng``: one
    key per window, or None. Returns the new stream, the score variant's auxiliary value and the
    heads' weights (None for the analytic sublayer)."""
    rng_attn, rng_mlp = common.split_keys(rng)  # each window's key, split in two
    with jax.named_scope("attention"):  # the names a profile shows (rank4jax.training.profiling)
        attended, aux, weights = attention(layer, x, key_mask)  # Attn(LN_attn(x))  (G, R, D)
        x = x + dropout(attended, rng_attn)  # (G, R, D)
    with jax.named_scope("mlp"):
        u = layer_norm(x, layer["ln_mlp"]["scale"], layer["ln_mlp"]["bias"])  # LN_mlp(x)  (G, R, D)
        x = x + dropout(apply_mlp(layer["mlp"], u), rng_mlp)  # (G, R, D)
    return x, aux, weights


def rank4_block(
    layer: dict,
    x: jax.Array,
    key_mask: jax.Array,
    *,
    dropout: float = 0.0,
    train: bool = False,
    rng: jax.Array | None = None,
    attention=None,
) -> jax.Array:
    """One Pre-LN rank-4 layer (SPEC §3–§4) of a stream x (B, *grid, dx, dt) with key_mask (B, *grid)
    → (B, *grid, dx, dt): the layer the model stacks, on any grid.

    ``layer``: {ln_attn, attn, ln_mlp, mlp} as ``rank4jax.init_params`` makes each layer (plus a score
    variant's entry); ``dropout``: the rate of both branches, applied when ``train`` (``rng``: a key;
    each window's masks come from ``fold_in(rng, window)``, or pass one key per window);
    ``attention``: a sublayer (:func:`attention_sublayer`; default the paper's, autodiff)."""
    batch, width = x.shape[0], x.shape[-2] * x.shape[-1]
    chex.assert_shape(key_mask, x.shape[:-2])
    if train and dropout > 0.0 and rng is None:
        raise ValueError("rank4_block(train=True) with dropout > 0 needs rng")
    y, _, _ = pre_ln_block(
        layer,
        x.reshape(batch, -1, width),  # (B, P, D)
        key_mask.reshape(batch, -1),  # (B, K)
        attention=attention or autodiff_attention,
        dropout=lambda y, keys: common.dropout(y, dropout, keys, train),
        rng=common.window_keys(rng, batch),
    )
    return y.reshape(x.shape)  # (B, *grid, dx, dt)
