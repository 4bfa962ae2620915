"""Composition of the rank-4 model (SPEC §2–§4): embedding → L Pre-LN layers (``block.apply_layer``)
→ final LN → readout.

Axes: B batch, T input slices, N tokens per state, dx/dt fibers, D = dx·dt, P = N·T positions
(flattened as p = x·T + t; the joint softmax does not depend on this order), V vocabulary; G, R
the rows of a layout (``rank4jax.models.rank4.layout``: full, trimmed or compact batches — one
forward serves them all: :func:`hidden_rows` arranges the rows, each layer moves them to the
windows' grids for the heads and back).

Parameter tree (nested dicts; shapes in SPEC §10 except the attention maps, kept as (H, D, D)):

    embed:   {sem (V, dx), tmp (V, dt)}             the paper's token code; ``token_code="flat"``: {tok (V, D)}
    readout: {tmp (V, dt)}                         W′ (none for the flat code, tied to E)
    layers:  [{ln_attn: {scale, bias} (dx, dt), attn: {wq, wk, wv} (H, D, D),
               ln_mlp: {scale, bias} (dx, dt), mlp: {w1 (D, 4D), b1 (4D,), w2 (4D, D), b2 (D,)}}] × L
    final_ln: {scale, bias} (dx, dt)

The variants are received from the config at one place (``cfg.tokens``: the token code;
``cfg.sublayer``: a score term, the §6 backward or axial attention); an attention-score variant
(``cfg.score``, ``rank4jax.models.scores``) adds its own entry to each layer.
"""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp

from rank4jax.models import common
from rank4jax.models.common import init_layer_norm, layer_norm
from rank4jax.models.rank4.block import apply_layer, init_layer
from rank4jax.models.rank4.codes import embed_rows
from rank4jax.models.rank4.config import Rank4Config
from rank4jax.models.rank4.layout import Rows, training_rows, window_rows
from rank4jax.models.rank4.losses import code_loss_sums


def init_params(key: jax.Array, cfg: Rank4Config, dtype=jnp.float32) -> dict:
    """Initial parameters (SPEC §5). Use ``jax.eval_shape`` for shapes without allocating."""
    k_embed, k_readout, k_layers = jax.random.split(key, 3)
    layer_keys = jax.random.split(k_layers, cfg.n_layers)
    layers = [init_layer(k, cfg.dx, cfg.dt, cfg.n_heads, cfg.score, dtype) for k in layer_keys]
    sizes = (cfg.vocab_size, cfg.dx, cfg.dt)  # V, dx, dt
    embed, readout = cfg.tokens.init_embed(k_embed, *sizes, dtype), cfg.tokens.init_readout(k_readout, *sizes, dtype)
    params = {"embed": embed, "layers": layers, "final_ln": init_layer_norm((cfg.dx, cfg.dt), dtype)}
    return params | ({} if readout is None else {"readout": readout})


def key_padding_mask(inputs: jax.Array) -> jax.Array:
    """inputs (B, T, N) → key_mask (B, P) bool, True where the token is not PAD (p = x·T + t)."""
    return window_rows(inputs).key_mask()


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
    y, aux, _ = _stack(params, rows, cfg, train=train, rng=rng, embedded=embedded)
    return y, aux


def _stack(params: dict, rows: Rows, cfg: Rank4Config, *, train: bool, rng, embedded=None):
    """The model's one loop over its layers: (Y (G, R, D), the mean auxiliary value, each layer's weights)."""
    chex.assert_equal_shape([rows.tokens, rows.position, rows.slice])
    common.check_params(params, "rank4", "the rank-4 forward")
    if train and cfg.dropout > 0.0 and rng is None:
        raise ValueError("forward(train=True) with dropout > 0 needs rng")
    keys = common.window_keys(rng, rows.n_windows) if train else None  # one dropout key per window (G·W,)
    x = embed_rows(params["embed"], rows, cfg) if embedded is None else embedded  # X at the rows (G, R, D)
    chex.assert_shape(x, rows.tokens.shape + (cfg.width,))
    mask = rows.key_mask()  # a key wherever the windows' grids hold a token  (B, K)
    auxes, maps = [], []
    for index, layer in enumerate(params["layers"]):
        layer_keys = common.fold_in_keys(keys, index)  # (G·W,) or None
        x, aux, weights = apply_layer(
            layer, x, mask, sublayer=cfg.sublayer, layout=rows, rate=cfg.dropout, keys=layer_keys
        )  # (G, R, D)
        auxes.append(aux)
        maps.append(weights)
    y = layer_norm(x, params["final_ln"]["scale"], params["final_ln"]["bias"])  # Y (G, R, D)
    chex.assert_shape(y, rows.tokens.shape + (cfg.width,))
    return y, jnp.mean(jnp.stack(auxes)), maps


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
    sums = code_loss_sums(params, y[:, :n_target_rows], rows.targets, last, cfg.tokens)
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
    the autodiff sublayer)."""
    batch, cfg = inputs.shape[0], dataclasses.replace(cfg, attention="autodiff")
    _, _, maps = _stack(params, window_rows(inputs), cfg, train=False, rng=None)
    grid = (cfg.n_tokens, cfg.n_slices)
    return [weights.reshape((batch, cfg.n_heads) + grid + grid) for weights in maps]


def forward(
    params: dict, inputs: jax.Array, cfg: Rank4Config, *, train: bool = False, rng: jax.Array | None = None
) -> jax.Array:
    """inputs (B, T, N) int32 = S(0..T-1) → logits (B, N, T, V) (SPEC §11)."""
    batch = inputs.shape[0]
    y = hidden_states(params, inputs, cfg, train=train, rng=rng)
    logits = cfg.tokens.logits(params, y)  # (B, P, V)
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
    logits = cfg.tokens.logits(params, y)  # (B, N, V)
    chex.assert_shape(logits, (batch, cfg.n_tokens, cfg.vocab_size))
    return logits


def count_params(cfg: Rank4Config) -> int:
    """Parameter count from ``jax.eval_shape`` (nothing is allocated)."""
    return common.count_params(init_params, cfg)
