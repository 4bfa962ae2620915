"""Flax NNX layers of the rank-4 model, each a thin module over the pure functions the trainer runs.

Axes: B batch, a grid of any shape (the stories' (N, T) of N tokens × T slices; frames × patches
works the same), P = K its cells, dx/dt fibers, D = dx·dt, H heads.

**What the layer is.** In SPEC's terms, a rank-4 layer is Pre-LN multi-head attention over the
flattened key grid whose tokens are D-vectors: every map (WQ_h, WK_h, WV_h, each D × D; the MLP
D → 4D → D) is dense over the whole fiber, the LayerNorms and the MLP run on the flattened fiber,
the H heads are full width and summed with no output map, and one softmax runs over all P cells,
blind to where a cell sits. The block on a (6, 8) grid of (4, 4) fibers is exactly the block on a
flat 48-cell grid of (16, 1) fibers (tested). What is rank-4 in the paper's model is around the
block: the token code Esem ⊗ Etmp (:class:`OuterProductEmbed` for any input), the position codes
P[x] + R[x + t] on the (N, T) grid (:func:`position_codes`) and the factorised readout. A layer has
3·H·D² attention parameters, where standard attention of width D has 4·D² (at the paper's D = 2,048
and H = 4: 50M a layer).

Every module keeps exactly the functional parameters as ``nnx.Param`` leaves: ``to_params()`` gives
the dict the functions take (``rank4jax.init_params``'s layout), ``from_params(...)`` builds the
module from one. Flax's habits hold: keyword-only ``rngs`` (``nnx.Rngs(params=0, dropout=1)``;
dropout draws from the module's own ``dropout`` stream), ``.train()`` / ``.eval()`` and
``deterministic`` as ``nnx.Dropout`` has them (modules start in training mode), ``dtype`` the
compute dtype (None: promote inputs and parameters) and ``param_dtype`` the storage dtype,
``kernel_init`` overridable (SPEC §5's U(±1/sqrt(fan_in)) by default; ``nnx.with_partitioning``
keeps its own names), each parameter's logical axis names as its ``out_sharding`` metadata (resolved
by ``nnx.logical_axis_rules``, else by the trainer's rules), and the attention weights by ``sow``
(``nnx.Intermediate``). Every module computes in, and returns, its compute dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from rank4jax.models import scores
from rank4jax.models.common import apply_mlp, fan_in_uniform, init_layer_norm, init_mlp, layer_norm
from rank4jax.models.rank4 import block as functional
from rank4jax.models.rank4.attention import grid_mask, init_attention, joint_heads
from rank4jax.models.rank4.config import Rank4Config
from rank4jax.models.rank4.layout import ON_GRID
from rank4jax.models.sizes import check_dropout, check_positive_int
from rank4jax.nn.common import (
    cast,
    check_extra,
    check_stream,
    compute_dtype,
    dropout_keys,
    dropout_stream,
    initial,
    param,
)


def check_sizes(owner: str, **sizes) -> None:
    for name, value in sizes.items():
        check_positive_int(f"{owner}: {name}", value)


class FiberLayerNorm(nnx.Module):
    """LayerNorm over a whole (dx, dt) fiber (SPEC §3): scale and bias (dx, dt), ε = 1e-5."""

    def __init__(
        self,
        dx: int,
        dt: int,
        *,
        dtype=None,
        param_dtype=jnp.float32,
        scale_init=nnx.initializers.ones,
        bias_init=nnx.initializers.zeros,
        rngs: nnx.Rngs | None = None,
        params=None,
    ):
        check_sizes("FiberLayerNorm", dx=dx, dt=dt)
        del rngs  # no draw: accepted as flax's LayerNorm accepts it
        if params is None and (scale_init, bias_init) == (nnx.initializers.ones, nnx.initializers.zeros):
            params = init_layer_norm((dx, dt), param_dtype)
        elif params is None:
            key = jax.random.key(0)  # constant initialisers take no randomness
            params = {"scale": scale_init(key, (dx, dt), param_dtype), "bias": bias_init(key, (dx, dt), param_dtype)}
        self.fiber, self.dtype = (dx, dt), dtype
        self.scale = param(params["scale"], "ln", "scale", "FiberLayerNorm")  # (dx, dt)
        self.bias = param(params["bias"], "ln", "bias", "FiberLayerNorm")  # (dx, dt)

    def to_params(self) -> dict:
        return {"scale": self.scale.get_value(), "bias": self.bias.get_value()}

    def __call__(self, x: jax.Array) -> jax.Array:
        """x (..., dx, dt) → (..., dx, dt), normalised over each fiber."""
        if getattr(x, "ndim", 0) < 2 or tuple(x.shape[-2:]) != self.fiber:
            raise ValueError(f"FiberLayerNorm: x must end in the fiber (dx, dt) = {self.fiber}, got {x.shape}")
        params = self.to_params()
        dtype = compute_dtype(self.dtype, x, *params.values())
        params, x = cast(params, dtype), x.astype(dtype)
        y = layer_norm(x.reshape(x.shape[:-2] + (x.shape[-2] * x.shape[-1],)), params["scale"], params["bias"])
        return y.reshape(x.shape)  # (..., dx, dt)


class Rank4MLP(nnx.Module):
    """The GELU MLP of a layer: D → 4D → D with biases, on the flattened fiber."""

    def __init__(
        self,
        dx: int,
        dt: int,
        *,
        dtype=None,
        param_dtype=jnp.float32,
        kernel_init=fan_in_uniform,
        rngs: nnx.Rngs | None = None,
        params=None,
    ):
        check_sizes("Rank4MLP", dx=dx, dt=dt)
        params = initial(params, rngs, lambda key: init_mlp(key, dx * dt, param_dtype, kernel_init))
        self.fiber, self.dtype = (dx, dt), dtype
        self.w1 = param(params["w1"], "mlp", "w1", "Rank4MLP")  # (D, 4D)
        self.b1 = param(params["b1"], "mlp", "b1", "Rank4MLP")  # (4D,)
        self.w2 = param(params["w2"], "mlp", "w2", "Rank4MLP")  # (4D, D)
        self.b2 = param(params["b2"], "mlp", "b2", "Rank4MLP")  # (D,)

    def to_params(self) -> dict:
        return {name: getattr(self, name).get_value() for name in ("w1", "b1", "w2", "b2")}

    def __call__(self, x: jax.Array) -> jax.Array:
        """x (..., dx, dt) → W2·GELU(W1·x + b1) + b2 on each flattened fiber (..., dx, dt)."""
        if getattr(x, "ndim", 0) < 2 or tuple(x.shape[-2:]) != self.fiber:
            raise ValueError(f"Rank4MLP: x must end in the fiber (dx, dt) = {self.fiber}, got {x.shape}")
        params = self.to_params()
        dtype = compute_dtype(self.dtype, x, *params.values())
        flat = x.astype(dtype).reshape(x.shape[:-2] + (x.shape[-2] * x.shape[-1],))  # (..., D)
        return apply_mlp(cast(params, dtype), flat).reshape(x.shape)


class Rank4Attention(nnx.Module):
    """Rank-4 attention (SPEC §3): full-width multi-head attention over the flattened key grid with
    D-vector tokens. H heads, each with full (D, D) maps WQ_h, WK_h, WV_h (no bias), the score
    contracting both fibers at 1/sqrt(D), one softmax over every key cell of the grid, the heads'
    outputs summed (no output map). ``causal_axis``: the grid axis ``is_causal`` orders unless the
    call names one (default the last: the stories' slices of their (N, T) grid)."""

    def __init__(
        self,
        dx: int,
        dt: int,
        n_heads: int,
        *,
        causal_axis: int = -1,
        dtype=None,
        param_dtype=jnp.float32,
        kernel_init=fan_in_uniform,
        rngs: nnx.Rngs | None = None,
        params=None,
    ):
        check_sizes("Rank4Attention", dx=dx, dt=dt, n_heads=n_heads)
        params = initial(params, rngs, lambda key: init_attention(key, n_heads, dx * dt, param_dtype, kernel_init))
        self.fiber, self.causal_axis, self.dtype = (dx, dt), causal_axis, dtype
        self.wq = param(params["wq"], "attn", "wq", "Rank4Attention")  # (H, D, D), input fiber first
        self.wk = param(params["wk"], "attn", "wk", "Rank4Attention")
        self.wv = param(params["wv"], "attn", "wv", "Rank4Attention")

    def to_params(self) -> dict:
        return {"wq": self.wq.get_value(), "wk": self.wk.get_value(), "wv": self.wv.get_value()}

    def _heads(self, x, mask, extra, is_causal, causal_axis):
        check_stream(x, self.fiber, "Rank4Attention")
        axis = self.causal_axis if causal_axis is None else causal_axis
        mask = grid_mask(mask, x.shape, "Rank4Attention", is_causal, axis)
        extra = check_extra(extra, x.shape, "Rank4Attention")
        params = self.to_params()
        dtype = compute_dtype(self.dtype, x, *params.values())
        u = x.astype(dtype).reshape(x.shape[0], -1, x.shape[-2] * x.shape[-1])  # (B, P, D)
        extra = None if extra is None else extra.astype(dtype)
        return joint_heads(cast(params, dtype), u, mask, extra)  # Σ_h O_h (B, P, D), the heads' tensors

    def __call__(
        self,
        x: jax.Array,
        mask: jax.Array | None = None,
        *,
        extra: jax.Array | None = None,
        is_causal: bool = False,
        causal_axis: int | None = None,
        sow_weights: bool = False,
    ) -> jax.Array:
        """x (B, *grid, dx, dt), a normalised stream → Σ_h A_h·V_h (B, *grid, dx, dt).

        ``mask`` bool: a key mask broadcastable to (B, *grid), True where the cell is a key (None: every
        cell), or a pairwise mask (B, [H,] P, K) over the cells in C order as ``nnx.MultiHeadAttention``
        takes one; ``extra`` (B, P, K): an additive score term over the cells, added to every head's
        scores before the mask (how a score variant such as ZPX enters); ``is_causal``: each query sees
        only the keys at or before it along ``causal_axis`` (this call's, else the module's);
        ``sow_weights``: keep the heads' weights (B, H, *grid, *grid) as the ``nnx.Intermediate``
        ``attention_weights``."""
        out, heads = self._heads(x, mask, extra, is_causal, causal_axis)
        if sow_weights:
            self.sow(nnx.Intermediate, "attention_weights", _on_grid(heads["weights"], x.shape))
        return out.reshape(x.shape)  # (B, *grid, dx, dt)

    def weights(
        self,
        x: jax.Array,
        mask: jax.Array | None = None,
        *,
        extra: jax.Array | None = None,
        is_causal: bool = False,
        causal_axis: int | None = None,
    ) -> jax.Array:
        """The heads' attention weights A (B, H, *grid, *grid): [b, h, query cell, key cell] (arguments as
        the call's)."""
        _, heads = self._heads(x, mask, extra, is_causal, causal_axis)
        return _on_grid(heads["weights"], x.shape)


class Rank4Block(nnx.Module):
    """One Pre-LN rank-4 layer (SPEC §3–§4) on any grid of (dx, dt) fibers:

        x ← x + Dropout(Attn(LN_attn(x)))
        x ← x + Dropout(MLP(LN_mlp(x)))

    Its call runs ``rank4jax.models.rank4.block.apply_layer``, the layer the trainer and
    ``rank4jax.forward`` run, over its submodules' parameters. ``dropout``: the rate of both branches,
    drawn from the module's ``rngs.dropout`` stream (or the call's ``rngs``) in training mode (the
    default; ``.eval()`` or ``deterministic=True`` turns it off). The variants are received once, as
    the trainer receives them (``block.sublayer``): ``score`` (an attention-score variant,
    ``rank4jax.models.scores``, whose term joins ``extra``; its parameters are ``self.score``) and
    ``attention`` ("autodiff", or "analytic": SPEC §6's hand-derived backward)."""

    def __init__(
        self,
        dx: int,
        dt: int,
        n_heads: int,
        *,
        dropout: float = 0.1,
        score=scores.STANDARD,
        attention: str = "autodiff",
        causal_axis: int = -1,
        deterministic: bool = False,
        dtype=None,
        param_dtype=jnp.float32,
        kernel_init=fan_in_uniform,
        rngs: nnx.Rngs | None = None,
        params=None,
    ):
        check_sizes("Rank4Block", dx=dx, dt=dt, n_heads=n_heads)
        check_dropout("Rank4Block: dropout", dropout)
        self.sublayer = functional.sublayer(attention, score)
        init = lambda key: functional.init_layer(key, dx, dt, n_heads, score, param_dtype, kernel_init)  # noqa: E731
        params = initial(params, rngs, init)
        self.fiber, self.rate, self.deterministic, self.dtype = (dx, dt), dropout, deterministic, dtype
        self.variant = score
        self.rngs = nnx.data(dropout_stream(rngs))
        self.ln_attn = FiberLayerNorm(dx, dt, dtype=dtype, params=params["ln_attn"])
        self.attn = Rank4Attention(dx, dt, n_heads, causal_axis=causal_axis, dtype=dtype, params=params["attn"])
        self.ln_mlp = FiberLayerNorm(dx, dt, dtype=dtype, params=params["ln_mlp"])
        self.mlp = Rank4MLP(dx, dt, dtype=dtype, params=params["mlp"])
        own = scores.layer_params(score, params)
        self.score = nnx.data(jax.tree.map(nnx.Param, own)) if own is not None else None

    @classmethod
    def from_params(cls, params: dict, cfg: Rank4Config, **options) -> Rank4Block:
        """A layer of ``rank4jax.init_params(...)["layers"]`` with ``cfg``'s sizes and variants."""
        options = {"dropout": cfg.dropout, "score": cfg.score, "attention": cfg.attention} | options
        return cls(cfg.dx, cfg.dt, cfg.n_heads, params=params, **options)

    def to_params(self) -> dict:
        layer = {
            "ln_attn": self.ln_attn.to_params(),
            "attn": self.attn.to_params(),
            "ln_mlp": self.ln_mlp.to_params(),
            "mlp": self.mlp.to_params(),
        }
        own = None if self.score is None else jax.tree.map(lambda v: v.get_value(), self.score, is_leaf=_is_var)
        return layer | ({} if own is None else {self.variant.name: own})

    def set_view(self, deterministic: bool | None = None):
        """``nnx.view(block, deterministic=...)``, as ``nnx.Dropout`` has it."""
        if deterministic is not None:
            self.deterministic = deterministic

    def __call__(
        self,
        x: jax.Array,
        mask: jax.Array | None = None,
        *,
        extra: jax.Array | None = None,
        is_causal: bool = False,
        causal_axis: int | None = None,
        deterministic: bool | None = None,
        rngs=None,
        sow_weights: bool = False,
    ) -> jax.Array:
        """x (B, *grid, dx, dt) → (B, *grid, dx, dt) in the compute dtype. ``mask``, ``extra``,
        ``is_causal``, ``causal_axis`` and ``sow_weights`` as :meth:`Rank4Attention.__call__`;
        ``deterministic`` over the module's; ``rngs`` (an ``nnx.Rngs``, a stream, a key or one key per
        window) over the module's dropout stream."""
        check_stream(x, self.fiber, "Rank4Block")
        axis = self.attn.causal_axis if causal_axis is None else causal_axis
        mask = grid_mask(mask, x.shape, "Rank4Block", is_causal, axis)
        extra = check_extra(extra, x.shape, "Rank4Block")
        train = not (self.deterministic if deterministic is None else deterministic)
        keys = dropout_keys(x.shape[0], rngs, self.rngs, "Rank4Block") if train and self.rate > 0 else None
        params = self.to_params()
        dtype = compute_dtype(self.dtype, x, *jax.tree.leaves(params))
        stream = x.astype(dtype).reshape(x.shape[0], -1, x.shape[-2] * x.shape[-1])  # (B, P, D)
        extra = None if extra is None else extra.astype(dtype)
        out, _, weights = functional.apply_layer(
            cast(params, dtype),
            stream,
            mask,
            sublayer=self.sublayer,
            layout=ON_GRID,
            rate=self.rate,
            keys=keys,
            extra=extra,
        )  # the layer, on the grid's cells  (B, P, D)
        if sow_weights:
            if weights is None:
                raise ValueError("Rank4Block(attention='analytic') gives no attention weights to sow")
            self.attn.sow(nnx.Intermediate, "attention_weights", _on_grid(weights, x.shape))
        return out.reshape(x.shape)  # (B, *grid, dx, dt)


def _on_grid(weights: jax.Array, x_shape: tuple) -> jax.Array:
    """The heads' weights (B, H, P, K) on the grid: (B, H, *grid, *grid)."""
    grid = tuple(x_shape[1:-2])
    return weights.reshape(weights.shape[:2] + grid + grid)


def _is_var(v) -> bool:
    return isinstance(v, nnx.Variable)
