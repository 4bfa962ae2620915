"""Flax NNX layers of the rank-4 model, each a thin module over the pure functions the trainer runs.

Axes: B batch, N tokens per state, T slices, a grid of any shape for the attention and the block
(the stories' grid is (N, T); frames × patches works the same), dx/dt fibers, D = dx·dt, H heads,
V vocabulary.

Every module keeps exactly the functional parameters as ``nnx.Param`` leaves: ``to_params()`` gives
the dict the functions take (``rank4jax.init_params``'s layout), ``from_params(...)`` builds the
module from one, and ``__call__`` runs the function on them, so outputs and gradients are the
functional model's. A module built with ``rngs`` initialises with the same init functions (SPEC §5)
from ``rngs.params()``.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from rank4jax.models import scores
from rank4jax.models.common import apply_mlp, init_layer_norm, init_mlp, layer_norm
from rank4jax.models.rank4.attention import init_attention, rank4_attention, rank4_attention_weights
from rank4jax.models.rank4.block import attention_sublayer, init_layer, rank4_block
from rank4jax.models.rank4.config import Rank4Config
from rank4jax.models.rank4.embedding import apply_embedding, init_embedding
from rank4jax.models.rank4.readout import apply_readout, init_readout


def param_tree(tree):
    """A pytree of arrays → the same tree of ``nnx.Param`` (module data)."""
    return nnx.data(jax.tree.map(nnx.Param, tree))


def values(tree):
    """A tree of ``nnx.Variable`` → the same tree of their arrays."""
    return jax.tree.map(lambda v: v.get_value(), tree, is_leaf=lambda v: isinstance(v, nnx.Variable))


def _initial(params, rngs, init):
    """The given parameters, else ``init(key)`` with a key from ``rngs.params()``."""
    if params is not None:
        return params
    if rngs is None:
        raise ValueError("pass rngs=nnx.Rngs(seed) to initialise the module, or build it with from_params")
    return init(rngs.params())


def _check_fiber(x: jax.Array, dx: int, dt: int, key_mask: jax.Array | None = None) -> None:
    chex.assert_axis_dimension(x, -2, dx)
    chex.assert_axis_dimension(x, -1, dt)
    if key_mask is not None:
        chex.assert_shape(key_mask, x.shape[:-2])


class Rank4Embedding(nnx.Module):
    """The input tensor (SPEC §2, Stages A–D): X = Esem[tok] ⊗ Etmp[tok] + P[x] + R[x + t].

    Parameters Esem (V, dx) and Etmp (V, dt), N(0, 1) with the PAD row zero; inputs (B, T, N) token
    ids (the states S(0..T−1), as ``rank4jax.forward`` takes them) → X (B, N, T, dx, dt)."""

    def __init__(self, cfg: Rank4Config, *, rngs: nnx.Rngs | None = None, dtype=jnp.float32, params=None):
        params = _initial(params, rngs, lambda key: init_embedding(key, cfg, dtype))
        self.cfg = cfg
        self.sem = nnx.Param(params["sem"])  # Esem (V, dx)
        self.tmp = nnx.Param(params["tmp"])  # Etmp (V, dt)

    @classmethod
    def from_params(cls, params: dict, cfg: Rank4Config) -> Rank4Embedding:
        return cls(cfg, params=params)

    def to_params(self) -> dict:
        return {"sem": self.sem.get_value(), "tmp": self.tmp.get_value()}

    def __call__(self, inputs: jax.Array) -> jax.Array:
        cfg = self.cfg
        chex.assert_shape(inputs, (None, cfg.n_slices, cfg.n_tokens))
        x = apply_embedding(self.to_params(), jnp.swapaxes(inputs, 1, 2), cfg)  # (B, N, T, dx, dt)
        return x


class FiberLayerNorm(nnx.Module):
    """LayerNorm over a whole fiber (dx, dt) (SPEC §3): scale and bias (dx, dt), ε = 1e-5."""

    def __init__(self, dx: int, dt: int, *, dtype=jnp.float32, params=None):
        params = params if params is not None else init_layer_norm((dx, dt), dtype)
        self.scale = nnx.Param(params["scale"])  # (dx, dt)
        self.bias = nnx.Param(params["bias"])  # (dx, dt)

    def to_params(self) -> dict:
        return {"scale": self.scale.get_value(), "bias": self.bias.get_value()}

    def __call__(self, x: jax.Array) -> jax.Array:
        dx, dt = self.scale.shape
        _check_fiber(x, dx, dt)
        y = layer_norm(x.reshape(x.shape[:-2] + (dx * dt,)), self.scale.get_value(), self.bias.get_value())
        return y.reshape(x.shape)  # (..., dx, dt)


class Rank4Attention(nnx.Module):
    """Rank-4 attention (SPEC §3): H heads, each with full (D, D) Q/K/V maps (no bias), the score
    contracting both fibers at 1/sqrt(D), one joint softmax over the whole key grid, head outputs
    summed. x (B, *grid, dx, dt) normalised stream, key_mask (B, *grid) bool → (B, *grid, dx, dt)."""

    def __init__(self, dx: int, dt: int, n_heads: int, *, rngs: nnx.Rngs | None = None, dtype=jnp.float32, params=None):
        params = _initial(params, rngs, lambda key: init_attention(key, n_heads, dx * dt, dtype))
        self.fiber = (dx, dt)
        self.wq = nnx.Param(params["wq"])  # (H, D, D), input fiber first
        self.wk = nnx.Param(params["wk"])
        self.wv = nnx.Param(params["wv"])

    def to_params(self) -> dict:
        return {"wq": self.wq.get_value(), "wk": self.wk.get_value(), "wv": self.wv.get_value()}

    def __call__(self, x: jax.Array, key_mask: jax.Array, extra: jax.Array | None = None) -> jax.Array:
        _check_fiber(x, *self.fiber, key_mask)
        return rank4_attention(self.to_params(), x, key_mask, extra)  # (B, *grid, dx, dt)

    def weights(self, x: jax.Array, key_mask: jax.Array) -> jax.Array:
        """The heads' attention weights A (B, H, *grid, *grid): [b, h, query cell, key cell]."""
        _check_fiber(x, *self.fiber, key_mask)
        return rank4_attention_weights(self.to_params(), x, key_mask)  # (B, H, *grid, *grid)


class Rank4MLP(nnx.Module):
    """The GELU MLP of a layer: D → 4D → D with biases, on the flattened fiber."""

    def __init__(self, dx: int, dt: int, *, rngs: nnx.Rngs | None = None, dtype=jnp.float32, params=None):
        params = _initial(params, rngs, lambda key: init_mlp(key, dx * dt, dtype))
        self.w1 = nnx.Param(params["w1"])  # (D, 4D)
        self.b1 = nnx.Param(params["b1"])  # (4D,)
        self.w2 = nnx.Param(params["w2"])  # (4D, D)
        self.b2 = nnx.Param(params["b2"])  # (D,)

    def to_params(self) -> dict:
        return {name: getattr(self, name).get_value() for name in ("w1", "b1", "w2", "b2")}

    def __call__(self, x: jax.Array) -> jax.Array:
        width = self.w1.shape[0]
        return apply_mlp(self.to_params(), x.reshape(x.shape[:-2] + (width,))).reshape(x.shape)


class Rank4Block(nnx.Module):
    """One Pre-LN rank-4 layer (SPEC §3–§4): x + Dropout(Attn(LN_attn(x))), then x + Dropout(MLP(LN_mlp(x))).

    x (B, *grid, dx, dt), key_mask (B, *grid) → (B, *grid, dx, dt). Dropout (``dropout``, both branches)
    runs when the module is in train mode (``.train()``; ``deterministic`` False) and needs ``rng``: a
    key (each window's masks from ``fold_in(rng, window)``) or one key per window. The variants are
    composed in once here: ``score`` (an attention-score variant, ``rank4jax.models.scores``; its
    parameters join the layer as ``self.score``) and ``attention`` ("autodiff", or "analytic": SPEC
    §6's hand-derived backward)."""

    def __init__(
        self,
        dx: int,
        dt: int,
        n_heads: int,
        *,
        dropout: float = 0.1,
        score=scores.STANDARD,
        attention: str = "autodiff",
        rngs: nnx.Rngs | None = None,
        dtype=jnp.float32,
        params=None,
    ):
        params = _initial(params, rngs, lambda key: init_layer(key, dx, dt, n_heads, score, dtype))
        self.fiber, self.dropout, self.deterministic = (dx, dt), dropout, True
        self.variant = score
        self.attention_fn = attention_sublayer(attention, score)  # composed once
        self.ln_attn = FiberLayerNorm(dx, dt, params=params["ln_attn"])
        self.attn = Rank4Attention(dx, dt, n_heads, params=params["attn"])
        self.ln_mlp = FiberLayerNorm(dx, dt, params=params["ln_mlp"])
        self.mlp = Rank4MLP(dx, dt, params=params["mlp"])
        own = scores.layer_params(score, params)
        self.score = param_tree(own) if own is not None else None

    @classmethod
    def from_params(cls, params: dict, cfg: Rank4Config) -> Rank4Block:
        """A layer of ``rank4jax.init_params(...)["layers"]`` with ``cfg``'s sizes and variants."""
        options = {"dropout": cfg.dropout, "score": cfg.score, "attention": cfg.attention}
        return cls(cfg.dx, cfg.dt, cfg.n_heads, params=params, **options)

    def to_params(self) -> dict:
        layer = {
            "ln_attn": self.ln_attn.to_params(),
            "attn": self.attn.to_params(),
            "ln_mlp": self.ln_mlp.to_params(),
            "mlp": self.mlp.to_params(),
        }
        return layer | ({} if self.score is None else {self.variant.name: values(self.score)})

    def __call__(self, x: jax.Array, key_mask: jax.Array, *, rng=None, deterministic: bool | None = None):
        _check_fiber(x, *self.fiber, key_mask)
        train = not (self.deterministic if deterministic is None else deterministic)
        options = {"dropout": self.dropout, "train": train, "rng": rng, "attention": self.attention_fn}
        return rank4_block(self.to_params(), x, key_mask, **options)  # (B, *grid, dx, dt)


class Rank4Readout(nnx.Module):
    """The tied, factorised readout (SPEC §4): logits[v] = Σ_{n,q} Y[n, q]·Esem[v, n]·W′[v, q].

    Holds W′ (V, dt) ~ N(0, 1/D); Esem is the embedding's, passed at the call (tied). y (B, *grid, dx,
    dt) final-normed stream, sem (V, dx) → logits (B, *grid, V)."""

    def __init__(self, vocab_size: int, dx: int, dt: int, *, rngs=None, dtype=jnp.float32, params=None):
        params = _initial(params, rngs, lambda key: init_readout(key, vocab_size, dt, dx * dt, dtype))
        self.tmp = nnx.Param(params["tmp"])  # W′ (V, dt)

    def to_params(self) -> dict:
        return {"tmp": self.tmp.get_value()}

    def __call__(self, y: jax.Array, sem: jax.Array) -> jax.Array:
        _check_fiber(y, sem.shape[1], self.tmp.shape[1])
        flat = y.reshape(y.shape[0], -1, y.shape[-2] * y.shape[-1])  # (B, P, D)
        logits = apply_readout(sem, self.tmp.get_value(), flat)  # (B, P, V)
        return logits.reshape(y.shape[:-2] + (logits.shape[-1],))  # (B, *grid, V)
