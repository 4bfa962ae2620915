"""Composition of the rank-4 model (SPEC §2–§4): embedding → L Pre-LN layers → final LN → readout.

Axes: B batch, T input slices, N tokens per state, dx/dt fibers, D = dx·dt, P = N·T positions
(flattened as p = x·T + t; the joint softmax does not depend on this order), V vocabulary; G, R
the rows of a layout (``rank4jax.models.rank4.layout``: full, trimmed or compact batches — one
forward serves them all).

Parameter tree (nested dicts; shapes in SPEC §10 except the attention maps, kept as (H, D, D)):

    embed:   {sem (V, dx), tmp (V, dt)}
    readout: {tmp (V, dt)}                         W′
    layers:  [{ln_attn: {scale, bias} (dx, dt), attn: {wq, wk, wv} (H, D, D),
               ln_mlp: {scale, bias} (dx, dt), mlp: {w1 (D, 4D), b1 (4D,), w2 (4D, D), b2 (D,)}}] × L
    final_ln: {scale, bias} (dx, dt)

An attention-score variant (``cfg.score``, ``rank4jax.models.scores``) adds its own entry to each
layer and a score term to every head; the paper's model holds ``scores.STANDARD``, which adds nothing.
"""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp

from rank4jax.models import common, scores
from rank4jax.models.common import apply_mlp, init_layer_norm, init_mlp, layer_norm
from rank4jax.models.rank4.analytic import attention_block
from rank4jax.models.rank4.attention import attend_heads, init_attention
from rank4jax.models.rank4.config import Rank4Config
from rank4jax.models.rank4.embedding import embed_rows, init_embedding
from rank4jax.models.rank4.layout import Rows, training_rows, window_rows
from rank4jax.models.rank4.losses import row_loss_sums
from rank4jax.models.rank4.readout import apply_readout, init_readout


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
        layers.append(layer | scores.init_layer_params(cfg.score, layer_key, cfg.width, dtype))
    return {
        "embed": init_embedding(k_embed, cfg, dtype),
        "readout": init_readout(k_readout, cfg.vocab_size, cfg.dt, cfg.width, dtype),
        "layers": layers,
        "final_ln": init_layer_norm(fiber, dtype),
    }


def key_padding_mask(inputs: jax.Array) -> jax.Array:
    """inputs (B, T, N) → key_mask (B, P) bool, True where the token is not PAD (p = x·T + t)."""
    return window_rows(inputs).key_mask()


def apply_layer(layer: dict, x: jax.Array, attend, cfg: Rank4Config, *, train: bool, rng, rows: Rows):
    """One Pre-LN layer (SPEC §3–§4) on the stream x (G, R, D): x + Attn(LN(x)), then x + MLP(LN(x)),
    dropout on each branch (``rng``: one key per window, or None). ``attend(layer, x, u)``: the
    layer's attention of the normalised rows u (:func:`attention_of`, composed once per forward).
    Returns the new stream, the score variant's auxiliary value and the heads' weights."""
    rng_attn, rng_mlp = common.split_keys(rng)
    with jax.named_scope("attention"):  # the names a profile shows (rank4jax.training.profiling)
        u = layer_norm(x, layer["ln_attn"]["scale"], layer["ln_attn"]["bias"])
        attended, aux, weights = attend(layer, x, u)
        x = x + rows.dropout(attended, cfg.dropout, rng_attn, train)
    with jax.named_scope("mlp"):
        u = layer_norm(x, layer["ln_mlp"]["scale"], layer["ln_mlp"]["bias"])
        x = x + rows.dropout(apply_mlp(layer["mlp"], u), cfg.dropout, rng_mlp, train)
    return x, aux, weights


def attention_of(cfg: Rank4Config, rows: Rows, key_mask: jax.Array):
    """``attend(layer, x, u) -> (Σ_h O_h, aux, weights (B, H, P, K) | None)`` for ``cfg``: the score
    variant's term (``cfg.score``) added to every head's score, the heads computed on ``rows`` (any
    layout), with autodiff's backward, or the §6 hand-derived one (``cfg.attention == "analytic"``:
    full or trimmed windows, the paper's score; it normalises x itself inside its custom VJP)."""
    if cfg.attention == "analytic":
        if rows.grid is not None:
            raise ValueError("the analytic (§6) backward runs on full or trimmed windows only")

        def analytic(layer, x, u):
            del u
            return attention_block(x, layer["ln_attn"], layer["attn"], key_mask), jnp.zeros((), x.dtype), None

        return analytic

    def autodiff(layer, x, u):
        del x
        extra, aux = cfg.score.scores(scores.layer_params(cfg.score, layer), rows.to_grid(u), key_mask)
        out, heads = attend_heads(layer["attn"], u, key_mask, extra, rows)
        return out, aux, jnp.stack([a for _, _, _, a in heads], axis=1)  # unused weights: dropped under jit

    return autodiff


def hidden_rows(
    params: dict,
    rows: Rows,
    cfg: Rank4Config,
    *,
    train: bool = False,
    rng: jax.Array | None = None,
    embedded: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Rows of any layout → (the final-normed stream Y at the rows (G, R, D), the mean over layers
    of the score variant's auxiliary value). ``embedded`` (G, R, D): the input tensor X at the rows
    in place of the embedding of ``rows.tokens`` (which still set the key mask), e.g. to take
    ``jax.grad`` with respect to X."""
    chex.assert_equal_shape([rows.tokens, rows.position, rows.slice])
    common.check_params(params, "rank4", "the rank-4 forward")
    if train and cfg.dropout > 0.0 and rng is None:
        raise ValueError("forward(train=True) with dropout > 0 needs rng")
    rng = common.window_keys(rng, rows.n_windows)  # one key per window
    x = embed_rows(params["embed"], rows, cfg) if embedded is None else embedded
    chex.assert_shape(x, rows.tokens.shape + (cfg.width,))
    attend = attention_of(cfg, rows, rows.key_mask())
    auxes = []
    for index, layer in enumerate(params["layers"]):
        layer_rng = common.fold_in_keys(rng, index)
        x, aux, _ = apply_layer(layer, x, attend, cfg, train=train, rng=layer_rng, rows=rows)
        auxes.append(aux)
    y = layer_norm(x, params["final_ln"]["scale"], params["final_ln"]["bias"])
    chex.assert_shape(y, rows.tokens.shape + (cfg.width,))
    return y, jnp.mean(jnp.stack(auxes))


def loss_sums(params: dict, batch, cfg: Rank4Config, *, train: bool = False, rng=None) -> tuple[dict, jax.Array]:
    """The window loss sums (``rank4jax.models.rank4.losses``) of a training batch — windows
    (B, T+1, N') with N' ≤ N, or a compact batch — and the score variant's auxiliary value. The
    readout runs on the rows that carry a target."""
    rows = training_rows(batch)
    if rows.n_positions > cfg.n_tokens * cfg.n_slices:
        raise ValueError(
            f"windows have {rows.n_positions // cfg.n_slices} token columns, more than n_tokens={cfg.n_tokens}"
        )
    n_target_rows = rows.targets.shape[1]
    y, aux = hidden_rows(params, rows, cfg, train=train, rng=rng)
    last = rows.slice[:, :n_target_rows] == cfg.n_slices - 1
    sums = row_loss_sums(y[:, :n_target_rows], params["embed"]["sem"], params["readout"]["tmp"], rows.targets, last)
    return sums, aux


def hidden_states(
    params: dict,
    inputs: jax.Array,
    cfg: Rank4Config,
    *,
    train: bool = False,
    rng: jax.Array | None = None,
    embedded: jax.Array | None = None,
) -> jax.Array:
    """inputs (B, T, N) int → final-normed stream Y (B, P, D). ``embedded`` (B, N, T, dx, dt): the
    input tensor X to run instead of the embedding of ``inputs`` (``apply_embedding``'s output, or a
    function of it); ``inputs`` still set the PAD key mask."""
    batch = inputs.shape[0]
    chex.assert_shape(inputs, (batch, cfg.n_slices, cfg.n_tokens))
    if embedded is not None:
        chex.assert_shape(embedded, (batch, cfg.n_tokens, cfg.n_slices, cfg.dx, cfg.dt))
        embedded = embedded.reshape(batch, cfg.n_tokens * cfg.n_slices, cfg.width)  # rows p = x·T + t
    return hidden_rows(params, window_rows(inputs), cfg, train=train, rng=rng, embedded=embedded)[0]


def attention_maps(params: dict, inputs: jax.Array, cfg: Rank4Config) -> list[jax.Array]:
    """Eval-mode attention weights of every layer, each (B, H, N, T, N, T): [b, h, x, t, x', t'], from
    the layer's one forward (the analytic backward's forward is the same: its weights come from
    the autodiff block)."""
    batch, cfg = inputs.shape[0], dataclasses.replace(cfg, attention="autodiff")
    rows = window_rows(inputs)
    x, attend = embed_rows(params["embed"], rows, cfg), attention_of(cfg, rows, rows.key_mask())
    grid = (cfg.n_tokens, cfg.n_slices)
    maps = []
    for layer in params["layers"]:
        x, _, weights = apply_layer(layer, x, attend, cfg, train=False, rng=None, rows=rows)
        maps.append(weights.reshape((batch, cfg.n_heads) + grid + grid))
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


def next_state_logits(
    params: dict, inputs: jax.Array, cfg: Rank4Config, embedded: jax.Array | None = None
) -> jax.Array:
    """Eval-mode logits of the next state S(T) only: (B, N, V), the slice t = T−1 of :func:`forward`.

    The readout, by far the costliest matmul at a word vocabulary, runs on the N positions of the
    last input slice instead of all P = N·T (what Story Cloze scoring, prediction and rollout need).
    ``embedded``: see :func:`hidden_states` (``jax.grad`` of a prediction with respect to X)."""
    batch = inputs.shape[0]
    y = hidden_states(params, inputs, cfg, embedded=embedded).reshape(batch, cfg.n_tokens, cfg.n_slices, cfg.width)[
        :, :, -1
    ]
    logits = apply_readout(params["embed"]["sem"], params["readout"]["tmp"], y)
    chex.assert_shape(logits, (batch, cfg.n_tokens, cfg.vocab_size))
    return logits


def count_params(cfg: Rank4Config) -> int:
    """Parameter count from ``jax.eval_shape`` (nothing is allocated)."""
    return common.count_params(init_params, cfg)
