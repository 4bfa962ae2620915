"""The rank-4 model on a compact batch: only the positions that can reach the loss (training fast path).

Axes: G groups (data shards), R rows per group (positions that matter), R_t rows with a target,
W windows per group, P = N·T positions of a window, H heads, D = dx·dt, V vocabulary. The batch
layout is built on the host by ``rank4jax.data.compact.compact_windows``:

    tokens, position, slice (G, R) · targets (G, R_t) · grid (G, W, P) → row · slot (G, R) → w·P + p

Everything position-wise (embedding, LayerNorms, Q/K/V projections, MLP, readout) runs on the
rows; only the joint softmax needs each window's positions side by side, so Q, K and V move to the
(W, P) grid (zero where a position was left out, a masked key there) and the summed head outputs
move back. Rows left out are masked keys with PAD targets
in the full-width model, so the loss sums equal the full-width ones (tested in float64, with dropout:
masks are the full-width ones, taken at the rows). ZPX scores and the analytic backward stay on the full-width path.
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp

from rank4jax.models.common import PAD_ID, apply_keep_mask, apply_mlp, keep_mask, layer_norm
from rank4jax.models.rank4.config import Rank4Config
from rank4jax.models.rank4.embedding import embed_tokens, position_tables
from rank4jax.models.rank4.losses import row_loss_sums


def _gather_rows(x: jax.Array, index: jax.Array) -> jax.Array:
    """x (G, M, F), index (G, M') in [0, M] → (G, M', F); index M reads a zero row."""
    padded = jnp.concatenate([x, jnp.zeros_like(x[:, :1])], axis=1)
    return jnp.take_along_axis(padded, index[..., None], axis=1)


@jax.custom_vjp
def move_rows(x: jax.Array, index: jax.Array, inverse: jax.Array) -> jax.Array:
    """x (G, M, F) → (G, M', F) with out[g, j] = x[g, index[g, j]] (zero where index = M).

    ``inverse`` (G, M) is the inverse map (inverse[g, index[g, j]] = j, M' where a row is unused):
    the backward pass is then the gather ``move_rows(g, inverse, index)``, not a scatter-add."""
    return _gather_rows(x, index)


def _move_rows_fwd(x, index, inverse):
    return _gather_rows(x, index), (index, inverse)


def _move_rows_bwd(residuals, cotangent):
    index, inverse = residuals
    return _gather_rows(cotangent, inverse), None, None


move_rows.defvjp(_move_rows_fwd, _move_rows_bwd)


def embed_rows(params: dict, tokens: jax.Array, position: jax.Array, slices: jax.Array, cfg: Rank4Config):
    """X of SPEC §2 at the rows: Esem[tok] ⊗ Etmp[tok] + P[x] + R[x + t] → (G, R, D)."""
    spatial, joint = position_tables(cfg, params["sem"].dtype)  # P (N, dx), R[x+t] (N, T, dt)
    x = embed_tokens(params, tokens, jnp.asarray(spatial)[position], jnp.asarray(joint)[position, slices])
    return x.reshape(tokens.shape + (cfg.width,))


def grid_attention(params: dict, u: jax.Array, batch: dict, key_mask: jax.Array, cfg: Rank4Config) -> jax.Array:
    """u (G, R, D) normalised rows → Σ_h O_h at the rows (G, R, D); the softmax runs over each
    window's positions (key_mask (G, W, P)). Heads are taken one at a time: every head's Q/K/V is a
    (G·R, D) × (D, D) matmul and no (B, H, P, D) transpose is formed."""
    groups, n_rows, width = u.shape
    _, n_windows, positions = batch["grid"].shape
    index = batch["grid"].reshape(groups, n_windows * positions)
    to_grid = functools.partial(move_rows, index=index, inverse=batch["slot"])
    scale = 1.0 / jnp.sqrt(jnp.asarray(width, u.dtype))
    grid_shape = (groups, n_windows, positions, width)
    out = jnp.zeros(grid_shape, u.dtype)
    for h in range(cfg.n_heads):
        q, k, v = (to_grid(u @ params[name][h]).reshape(grid_shape) for name in ("wq", "wk", "wv"))
        scores = jnp.einsum("gwse,gwke->gwsk", q, k) * scale
        scores = jnp.where(key_mask[:, :, None, :], scores, jnp.finfo(scores.dtype).min)
        out = out + jnp.einsum("gwsk,gwke->gwse", jax.nn.softmax(scores, axis=-1), v)
    return move_rows(out.reshape(groups, n_windows * positions, width), batch["slot"], index)


def row_dropout(x: jax.Array, batch: dict, cfg: Rank4Config, rng: jax.Array | None, train: bool) -> jax.Array:
    """Dropout at the rows with the full-width model's mask: the (B, P, D) keep mask of
    ``rank4jax.models.common.dropout``, read at each row's grid slot w·P + p. The bits cost B·P·D
    (small next to the matmuls), and a compact step then equals the full-width step exactly, on any
    number of groups."""
    if not train or cfg.dropout == 0.0:
        return x
    groups, _, width = x.shape
    _, n_windows, positions = batch["grid"].shape
    keep = keep_mask(rng, (groups * n_windows, positions, width), cfg.dropout)
    slot = jnp.minimum(batch["slot"], n_windows * positions - 1)  # filler rows read any slot
    keep = jnp.take_along_axis(keep.reshape(groups, n_windows * positions, width), slot[..., None], axis=1)
    return apply_keep_mask(x, keep, cfg.dropout)


def hidden_rows(params: dict, batch: dict, cfg: Rank4Config, *, train: bool = False, rng: jax.Array | None = None):
    """Compact batch → the final-normed stream Y at the rows (G, R, D)."""
    groups, n_rows = batch["tokens"].shape
    chex.assert_shape([batch["position"], batch["slice"], batch["slot"]], (groups, n_rows))
    chex.assert_rank(batch["grid"], 3)
    if cfg.zpx.enabled or cfg.attention != "autodiff":
        raise ValueError("compact batches cover the standard score with autodiff attention only")
    if train and cfg.dropout > 0.0 and rng is None:
        raise ValueError("forward(train=True) with dropout > 0 needs rng")
    x = embed_rows(params["embed"], batch["tokens"], batch["position"], batch["slice"], cfg)
    # a key wherever the grid holds a row with an input token (a left-out position reads a zero = PAD row)
    slots = _gather_rows(batch["tokens"][..., None], batch["grid"].reshape(groups, -1))[..., 0]
    key_mask = slots.reshape(batch["grid"].shape) != PAD_ID  # (G, W, P)
    for index, layer in enumerate(params["layers"]):
        # the same keys as rank4jax.models.rank4.model.apply_layer
        rng_attn, rng_mlp = (None, None) if rng is None else jax.random.split(jax.random.fold_in(rng, index))
        u = layer_norm(x, layer["ln_attn"]["scale"], layer["ln_attn"]["bias"])
        x = x + row_dropout(grid_attention(layer["attn"], u, batch, key_mask, cfg), batch, cfg, rng_attn, train)
        u = layer_norm(x, layer["ln_mlp"]["scale"], layer["ln_mlp"]["bias"])
        x = x + row_dropout(apply_mlp(layer["mlp"], u), batch, cfg, rng_mlp, train)
    y = layer_norm(x, params["final_ln"]["scale"], params["final_ln"]["bias"])
    chex.assert_shape(y, (groups, n_rows, cfg.width))
    return y


def compact_loss_sums(params: dict, batch: dict, cfg: Rank4Config, *, train=False, rng=None) -> dict:
    """The window loss sums (``rank4jax.models.rank4.losses``) of a compact batch: the readout runs
    on the R_t rows that carry a target."""
    n_target_rows = batch["targets"].shape[1]
    y = hidden_rows(params, batch, cfg, train=train, rng=rng)[:, :n_target_rows]
    last = batch["slice"][:, :n_target_rows] == cfg.n_slices - 1
    return row_loss_sums(y, params["embed"]["sem"], params["readout"]["tmp"], batch["targets"], last)
