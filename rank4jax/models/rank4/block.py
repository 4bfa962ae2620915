"""The rank-4 layer (SPEC §3–§4), written once: the trainer, ``rank4jax.forward``, the §6 analytic
check and ``rank4jax.nn.Rank4Block`` all run :func:`apply_layer`.

Axes: G groups and R rows of a layout (``rank4jax.models.rank4.layout``: compact batches keep only
the rows that reach the loss; for windows and any user's grid the rows are the grid, G = B, R = P),
B windows, P = N·T query and K key cells of a window's grid, H heads, D = dx·dt.

    x ← x + Dropout(Attn(LN_attn(x)))
    x ← x + Dropout(MLP(LN_mlp(x)))

The variants of the attention half are received as one :class:`Sublayer` (the paper's is
:data:`PAPER`, which runs no variant's code): a score term added to every head (ZPX), the §6
hand-derived backward (custom VJPs of LN_attn and the heads), and axial attention.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from rank4jax.errors import ConfigError
from rank4jax.models import scores
from rank4jax.models.common import apply_mlp, fan_in_uniform, init_layer_norm, init_mlp, layer_norm, split_keys
from rank4jax.models.common import window_keys as per_window_keys
from rank4jax.models.rank4 import analytic, attention, axial
from rank4jax.models.rank4.layout import ON_GRID

ATTENTION_MODES = ("autodiff", "analytic")  # "analytic": the §6 hand-derived backward as custom VJPs
ATTENTION_GRIDS = ("joint", "axial")  # "joint": the paper's one softmax over N·T; "axial": two hops (an ablation)


def init_layer(
    key: jax.Array, dx: int, dt: int, n_heads: int, score=scores.STANDARD, dtype=jnp.float32, kernel_init=fan_in_uniform
) -> dict:
    """One layer's parameters (SPEC §5): LayerNorms at 1 and 0, the (H, D, D) attention maps and the
    MLP's weights by ``kernel_init`` (U(±1/sqrt(fan_in))), the score variant's entry from a key of its own."""
    k_attn, k_mlp = jax.random.split(key)
    layer = {
        "ln_attn": init_layer_norm((dx, dt), dtype),
        "attn": attention.init_attention(k_attn, n_heads, dx * dt, dtype, kernel_init),
        "ln_mlp": init_layer_norm((dx, dt), dtype),
        "mlp": init_mlp(k_mlp, dx * dt, dtype, kernel_init),
    }
    return layer | scores.init_layer_params(score, key, dx * dt, dtype)


@dataclasses.dataclass(frozen=True)
class Sublayer:
    """How a layer's attention half runs: ``norm(x, scale, bias)``, its LayerNorm, and
    ``attend(layer, u, mask, extra) -> (Σ_h O_h (B, P, D), auxiliary value, weights (B, H, P, K) or
    None)``, the heads over the windows' grid."""

    norm: Callable = layer_norm
    attend: Callable = attention.attend


PAPER = Sublayer()  # the paper's: autodiff through LN_attn and the joint softmax, no score term


def sublayer(mode: str = "autodiff", score=scores.STANDARD, grid: str = "joint", n_slices: int | None = None):
    """The one place the attention variants are received (``Rank4Config.sublayer``, ``rank4jax.nn``):
    ``mode`` "autodiff" | "analytic" (§6), ``score`` a score variant (``rank4jax.models.scores``),
    ``grid`` "joint" | "axial" (two hops, T = ``n_slices``). The paper's settings give :data:`PAPER`."""
    if mode not in ATTENTION_MODES:
        raise ConfigError(f"attention must be one of {ATTENTION_MODES}, got {mode!r}")
    if grid not in ATTENTION_GRIDS:
        raise ConfigError(f"attention_grid must be one of {ATTENTION_GRIDS}, got {grid!r}")
    standard = score == scores.STANDARD
    if grid == "axial":
        if mode == "analytic" or not standard:
            raise ConfigError("axial attention runs with attention='autodiff' and the standard score only")
        return Sublayer(attend=functools.partial(axial.attend, n_slices=n_slices))
    if mode == "analytic":
        if not standard:
            raise ConfigError("the analytic (§6) backward covers the standard score only; use attention='autodiff'")
        return Sublayer(norm=analytic.layer_norm, attend=analytic.attend)
    return PAPER if standard else Sublayer(attend=functools.partial(scored_attend, score))


def scored_attend(score, layer: dict, u: jax.Array, mask: jax.Array, extra: jax.Array | None = None):
    """The paper's heads with a score variant's term added to every head's scores (``extra`` too), and
    the variant's auxiliary value. ``mask``: a key mask (B, K), which the variant reads."""
    if mask.ndim != 2:
        raise ValueError(f"a score variant ({score.name}) takes a key mask (B, K), not a pairwise mask {mask.shape}")
    term, aux = score.scores(scores.layer_params(score, layer), u, mask)  # (B, P, K), a scalar
    out, tensors = attention.joint_heads(layer["attn"], u, mask, term if extra is None else term + extra)
    return out, aux, tensors["weights"]


def apply_layer(
    layer: dict,
    x: jax.Array,
    mask: jax.Array,
    *,
    sublayer: Sublayer = PAPER,
    layout=ON_GRID,
    rate: float = 0.0,
    keys: jax.Array | None = None,
    extra: jax.Array | None = None,
):
    """One Pre-LN layer of the stream x (G, R, D) → (x, the sublayer's auxiliary value, the heads'
    weights (B, H, P, K) or None).

    ``mask`` the heads' (``attention``: (B, K), (B, P, K) or (B, H, P, K)); ``layout`` moves the rows
    to the windows' grids and back and draws their dropout (``layout.Rows``, or ``ON_GRID`` when the
    rows are the grid); ``keys``: one dropout key per window (G·W,) in training mode, None in eval
    mode; ``rate`` both branches' dropout; ``extra`` (B, P, K) a score term added to every head."""
    key_attn, key_mlp = split_keys(keys)  # each window's key split in two
    with jax.named_scope("attention"):  # the names a profile shows (rank4jax.training.profiling)
        u = sublayer.norm(x, layer["ln_attn"]["scale"], layer["ln_attn"]["bias"])  # U = LN_attn(x)  (G, R, D)
        u = layout.to_grid(u)  # on the windows' grids  (B, P, D)
        h, aux, weights = sublayer.attend(layer, u, mask, extra)  # Σ_h A_h·V_h  (B, P, D); A (B, H, P, K)
        h = layout.from_grid(h)  # back on the rows  (G, R, D)
        x = x + layout.dropout(h, rate, key_attn)  # the residual  (G, R, D)
    with jax.named_scope("mlp"):
        u = layer_norm(x, layer["ln_mlp"]["scale"], layer["ln_mlp"]["bias"])  # LN_mlp(x)  (G, R, D)
        h = apply_mlp(layer["mlp"], u)  # W2·GELU(W1·u + b1) + b2  (G, R, D)
        x = x + layout.dropout(h, rate, key_mlp)  # the residual  (G, R, D)
    return x, aux, weights


def rank4_block(
    layer: dict,
    x: jax.Array,
    mask=None,
    *,
    extra: jax.Array | None = None,
    is_causal: bool = False,
    causal_axis: int = -1,
    dropout: float = 0.0,
    train: bool = False,
    rng: jax.Array | None = None,
    sublayer: Sublayer = PAPER,
) -> jax.Array:
    """One Pre-LN rank-4 layer (SPEC §3–§4) of a stream x (B, *grid, dx, dt) → (B, *grid, dx, dt):
    :func:`apply_layer`, the layer the model stacks, on any grid.

    ``layer``: {ln_attn, attn, ln_mlp, mlp} as :func:`init_layer` makes it (plus a score variant's
    entry); ``mask``, ``is_causal``, ``causal_axis`` as ``attention.grid_mask`` (None: every cell a key);
    ``extra`` (B, P, K) a score term over the cells in C order; ``dropout`` both branches' rate, applied
    when ``train`` (``rng``: a key, each window's masks from ``fold_in(rng, window)``, or one key per
    window); ``sublayer``: :func:`sublayer`'s variants (default the paper's)."""
    batch, width = x.shape[0], x.shape[-2] * x.shape[-1]
    if train and dropout > 0.0 and rng is None:
        raise ValueError("rank4_block(train=True) with dropout > 0 needs rng")
    mask = attention.grid_mask(mask, x.shape, "rank4_block", is_causal, causal_axis)
    keys = per_window_keys(rng, batch) if train and dropout > 0.0 else None  # (B,)
    y, _, _ = apply_layer(
        layer, x.reshape(batch, -1, width), mask, sublayer=sublayer, rate=dropout, keys=keys, extra=extra
    )  # (B, P, D)
    return y.reshape(x.shape)  # (B, *grid, dx, dt)
