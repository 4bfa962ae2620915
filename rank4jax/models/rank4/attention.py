"""Rank-4 attention (SPEC §3).

Axes: B windows, H heads, P = N·T query positions (x, t) and K = N·T key positions (x', t') of the
joint grid, D = dx·dt the flattened fiber φ(n, q) = n·dt + q.

Every head keeps the full fiber: Q/K/V maps are D→D (no bias). The score contracts both fibers,
scaled by 1/sqrt(D); an optional score term shared by every head (a variant's, see
``rank4jax.models.scores``) is added; masked keys get the dtype's finite minimum; one softmax runs
jointly over the N·T key grid (``common.masked_softmax``); head outputs are summed (no 1/sqrt(H),
no output map).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rank4jax.models.common import fan_in_uniform, masked_softmax


def init_attention(key: jax.Array, n_heads: int, width: int, dtype=jnp.float32, kernel_init=fan_in_uniform) -> dict:
    """WQ, WK, WV each (H, D, D) for D = ``width`` = dx·dt, input fiber first, drawn by ``kernel_init``
    (SPEC §5's U(±1/sqrt(D)) by default)."""
    keys = jax.random.split(key, 3)
    shape = (n_heads, width, width)
    return {name: kernel_init(k, shape, dtype) for name, k in zip(("wq", "wk", "wv"), keys, strict=True)}


def attention_weights(q: jax.Array, k: jax.Array, key_mask: jax.Array, extra: jax.Array | None = None) -> jax.Array:
    """Joint-softmax weights of one head (q, k (B, P, D)) or all (q, k (B, H, P, D)) → (B, [H,] P, K).

    key_mask (B, K) bool, or (B, P, K) for keys that depend on the query; ``extra`` (B, P, K): a score
    term shared by every head, added before the mask."""
    heads = (1,) * (q.ndim - 3)  # broadcast over a head axis when there is one
    scale = 1.0 / jnp.sqrt(jnp.asarray(q.shape[-1], q.dtype))
    scores = jnp.einsum("...pd,...kd->...pk", q, k) * scale
    if extra is not None:
        scores = scores + extra.reshape(extra.shape[:1] + heads + extra.shape[1:])
    mask = key_mask[:, None, :] if key_mask.ndim == 2 else key_mask  # (B, P or 1, K)
    return masked_softmax(scores, mask.reshape(mask.shape[:1] + heads + mask.shape[1:]))


def attention_heads(
    params: dict, u: jax.Array, key_mask: jax.Array, extra: jax.Array | None = None
) -> tuple[jax.Array, dict]:
    """Rank-4 attention (SPEC §3) of the normalised stream u (B, P, D) over each window's joint key
    grid: the one implementation, which the trainer, the §6 block and ``rank4jax.nn`` all run.

    key_mask (B, K) bool (K = P); ``extra`` (B, P, K): a score term shared by every head (a score
    variant's), or None. Returns Σ_h O_h (B, P, D) and the heads' tensors, each stacked on a head axis:
    ``q``, ``k``, ``v`` (B, H, P, D) and ``weights`` A (B, H, P, K) (unused ones cost nothing under jit).
    The heads are taken one at a time, each a (D, D) map of the rows: no (B, H, P, D) transpose is
    formed for the matmuls."""
    out, heads = None, []
    for h in range(params["wq"].shape[0]):
        q = jnp.einsum("bpd,de->bpe", u, params["wq"][h])  # Q_h = U·WQ_h   (B, P, D)
        k = jnp.einsum("bkd,de->bke", u, params["wk"][h])  # K_h = U·WK_h   (B, K, D)
        v = jnp.einsum("bkd,de->bke", u, params["wv"][h])  # V_h = U·WV_h   (B, K, D)
        a = attention_weights(q, k, key_mask, extra)  # A_h: one softmax over the N·T keys (B, P, K)
        o = jnp.einsum("bpk,bke->bpe", a, v)  # O_h = A_h·V_h  (B, P, D)
        out = o if out is None else out + o  # Σ_h O_h: summed, no output map (B, P, D)
        heads.append((q, k, v, a))
    names = ("q", "k", "v", "weights")
    return out, {name: jnp.stack([head[i] for head in heads], axis=1) for i, name in enumerate(names)}


def rank4_attention(params: dict, x: jax.Array, key_mask: jax.Array, extra: jax.Array | None = None) -> jax.Array:
    """Rank-4 attention (SPEC §3) of a normalised stream x (B, *grid, dx, dt) — the stories' grid is
    (N, T); any other grid (frames × patches, …) works the same — with key_mask (B, *grid) bool (True:
    a key) → Σ_h O_h (B, *grid, dx, dt).

    What it is: full-width multi-head attention over the flattened key grid with D-vector tokens
    (D = dx·dt): each head's WQ_h, WK_h, WV_h is a dense (D, D) map of the whole fiber, one softmax
    runs over every cell of the grid whatever its place, and the heads are summed with no output map
    (3·H·D² parameters, where standard attention of width D has 4·D²). On a (6, 8) grid of (4, 4)
    fibers it is exactly the attention over 48 cells of (16, 1) fibers; the paper's rank-4 structure
    is in the token code, the position codes and the readout around it.

    ``params``: {wq, wk, wv} (H, D, D) with D = dx·dt (``init_attention``); ``extra`` (B, P, K) over
    the grid flattened in C order, or None. The functional layer of :func:`attention_heads`."""
    out, _ = attention_heads(params, *_on_flat_grid(x, key_mask), extra)  # (B, P, D)
    return out.reshape(x.shape)  # (B, *grid, dx, dt)


def rank4_attention_weights(params: dict, x: jax.Array, key_mask: jax.Array, extra: jax.Array | None = None):
    """The heads' attention weights of :func:`rank4_attention`: (B, H, *grid, *grid), [b, h, query
    cell, key cell]."""
    grid = x.shape[1:-2]
    _, heads = attention_heads(params, *_on_flat_grid(x, key_mask), extra)
    return heads["weights"].reshape(heads["weights"].shape[:2] + grid + grid)  # (B, H, *grid, *grid)


def _on_flat_grid(x: jax.Array, key_mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """x (B, *grid, dx, dt), key_mask (B, *grid) → (B, P, D), (B, P): grid flattened in C order."""
    batch = x.shape[0]
    return x.reshape(batch, -1, x.shape[-2] * x.shape[-1]), key_mask.reshape(batch, -1)
