"""Rank-4 attention (SPEC §3).

Axes: B batch, H heads, P = N·T query positions (x, t) and K = N·T key positions (x', t') of the
joint grid, D = dx·dt the flattened fiber φ(n, q) = n·dt + q.

Every head keeps the full fiber: Q/K/V maps are D→D (no bias). The score contracts both fibers,
scaled by 1/sqrt(D); masked keys get the dtype's finite minimum; one softmax runs jointly over the
N·T key grid; head outputs are summed (no 1/sqrt(H), no output map).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from rank4jax.models.common import uniform_fan_in
from rank4jax.models.rank4.config import Rank4Config


def init_attention(key: jax.Array, cfg: Rank4Config, dtype=jnp.float32) -> dict:
    """WQ, WK, WV each (H, D, D), input fiber first, ~ U(±1/sqrt(D))."""
    d = cfg.width
    keys = jax.random.split(key, 3)
    shape = (cfg.n_heads, d, d)
    return {name: uniform_fan_in(k, shape, d, dtype) for name, k in zip(("wq", "wk", "wv"), keys, strict=True)}


def project_qkv(params: dict, u: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """u (B, P, D) → Q, K, V each (B, H, P, D): every head maps the full fiber."""
    return tuple(jnp.einsum("bpd,hde->bhpe", u, params[name]) for name in ("wq", "wk", "wv"))


def attention_weights(q: jax.Array, k: jax.Array, key_mask: jax.Array, extra: jax.Array | None = None) -> jax.Array:
    """Joint-softmax weights. q, k (B, H, P, D); key_mask (B, K) bool → A (B, H, P, K).
    ``extra`` (B, P, K): a score term shared by every head (the ZPX geometry), added before the mask."""
    scale = 1.0 / jnp.sqrt(jnp.asarray(q.shape[-1], q.dtype))
    scores = jnp.einsum("bhpe,bhke->bhpk", q, k) * scale
    if extra is not None:
        scores = scores + extra[:, None]
    scores = jnp.where(key_mask[:, None, None, :], scores, jnp.finfo(scores.dtype).min)
    return jax.nn.softmax(scores, axis=-1)


def apply_attention(
    params: dict, u: jax.Array, key_mask: jax.Array, cfg: Rank4Config, extra: jax.Array | None = None
) -> jax.Array:
    """u (B, P, D) normalised stream; key_mask (B, P) bool → Σ_h O_h (B, P, D)."""
    batch, positions = u.shape[0], cfg.n_tokens * cfg.n_slices
    chex.assert_shape(u, (batch, positions, cfg.width))
    chex.assert_shape(key_mask, (batch, positions))
    q, k, v = project_qkv(params, u)
    a = attention_weights(q, k, key_mask, extra)
    out = jnp.einsum("bhpk,bhke->bpe", a, v)  # heads summed
    chex.assert_shape(out, (batch, positions, cfg.width))
    return out
