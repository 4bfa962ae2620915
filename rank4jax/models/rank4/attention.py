"""Rank-4 attention (SPEC §3).

Axes: B windows, H heads, P = N·T query positions (x, t) and K = N·T key positions (x', t') of the
joint grid, D = dx·dt the flattened fiber φ(n, q) = n·dt + q; G, R rows of a layout
(``rank4jax.models.rank4.layout``).

Every head keeps the full fiber: Q/K/V maps are D→D (no bias). The score contracts both fibers,
scaled by 1/sqrt(D); an optional score term shared by every head (a variant's, see
``rank4jax.models.scores``) is added; masked keys get the dtype's finite minimum; one softmax runs
jointly over the N·T key grid (``common.masked_softmax``); head outputs are summed (no 1/sqrt(H),
no output map).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rank4jax.models.common import masked_softmax, uniform_fan_in
from rank4jax.models.rank4.config import Rank4Config
from rank4jax.models.rank4.layout import Rows


def init_attention(key: jax.Array, cfg: Rank4Config, dtype=jnp.float32) -> dict:
    """WQ, WK, WV each (H, D, D), input fiber first, ~ U(±1/sqrt(D))."""
    d = cfg.width
    keys = jax.random.split(key, 3)
    shape = (cfg.n_heads, d, d)
    return {name: uniform_fan_in(k, shape, d, dtype) for name, k in zip(("wq", "wk", "wv"), keys, strict=True)}


def attention_weights(q: jax.Array, k: jax.Array, key_mask: jax.Array, extra: jax.Array | None = None) -> jax.Array:
    """Joint-softmax weights of one head (q, k (B, P, D)) or all (q, k (B, H, P, D)) → (B, [H,] P, K).

    key_mask (B, K) bool; ``extra`` (B, P, K): a score term shared by every head, added before the mask."""
    heads = (1,) * (q.ndim - 3)  # broadcast over a head axis when there is one
    scale = 1.0 / jnp.sqrt(jnp.asarray(q.shape[-1], q.dtype))
    scores = jnp.einsum("...pd,...kd->...pk", q, k) * scale
    if extra is not None:
        scores = scores + extra.reshape(extra.shape[:1] + heads + extra.shape[1:])
    mask = key_mask.reshape(key_mask.shape[:1] + heads + (1,) + key_mask.shape[1:])
    return masked_softmax(scores, mask)


def attend_heads(
    params: dict, u: jax.Array, key_mask: jax.Array, extra: jax.Array | None = None, rows: Rows | None = None
) -> tuple[jax.Array, list]:
    """u (G, R, D) normalised rows → (Σ_h O_h at the rows (G, R, D), per head (Q, K, V, A) on the grid).

    key_mask (G·W, P); ``rows`` None: the rows are the grid (full or trimmed windows). Heads are
    taken one at a time: each head's Q/K/V is one (G·R, D) × (D, D) matmul on the rows, moved to the
    grid for the softmax; no (B, H, P, D) transpose is formed. The §6 analytic block runs this same
    forward and keeps the per-head tensors for its backward (unused ones cost nothing under jit)."""
    to_grid = (lambda t: t) if rows is None else rows.to_grid
    out, saved = None, []
    for h in range(params["wq"].shape[0]):
        q, k, v = (to_grid(u @ params[name][h]) for name in ("wq", "wk", "wv"))
        a = attention_weights(q, k, key_mask, extra)
        o = jnp.einsum("bpk,bkd->bpd", a, v)
        out = o if out is None else out + o
        saved.append((q, k, v, a))
    return (out if rows is None else rows.from_grid(out)), saved


def joint_attention(params: dict, u: jax.Array, key_mask: jax.Array, extra=None, rows: Rows | None = None) -> jax.Array:
    """Σ_h O_h at the rows (G, R, D): rank-4 attention of the normalised rows u (see :func:`attend_heads`)."""
    return attend_heads(params, u, key_mask, extra, rows)[0]
