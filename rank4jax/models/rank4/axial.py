"""Axial attention over a window's (N, T) grid: a labelled variant of the paper's joint softmax
(``Rank4Config.attention_grid = "axial"``, received by ``block.sublayer``), after ViViT's and
TimeSformer's factorised space-time attention.

Axes: B windows, H heads, N tokens per slice (x), T slices (t), P = N·T query and K key cells of the
grid (p = x·T + t, as ``rank4jax.models.rank4.layout``), D = dx·dt.

Every head uses the joint block's own maps WQ_h, WK_h, WV_h (no parameter added: a layer has
3·H·D² attention parameters either way) and replaces the one softmax over the N·T keys by two hops:

    A^N_h[(x,t), (x',t)] = softmax over x' of Q_h(x,t)·K_h(x',t) / sqrt(D)     within the slice t
    A^T_h[(x,t), (x,t')] = softmax over t' of Q_h(x,t)·K_h(x,t') / sqrt(D)     across the slices, at x
    O_h = A^T_h · (A^N_h · V_h)

so a token (x', t') reaches the query (x, t) through the cell (x, t'), whose within-slice average
summarises its slice t'. The keys of the first hop are the slice's tokens (PAD cells masked, as in
the joint softmax); those of the second are the cells (x, t') holding a token and the query's own
cell, whose average is its own slice's even where the cell is PAD (where the slice has a token). A
query with no key in a hop gets nothing from it. A query therefore sees another slice only where
that slice has a token at its position x (a sentence shorter than x is out of its reach). Each query
scores N + T keys instead of N·T. With T = 1 (or N = 1) the hop left is the joint softmax and the
two blocks agree on windows with a token. Neither hop reads a cell that is neither a token nor the
query, so compact batches (which leave such cells out) compute what full windows do.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rank4jax.models.rank4.attention import attention_weights


def _slices(x: jax.Array, n_slices: int) -> jax.Array:
    """(B, P, ...) on the grid p = x·T + t → (B, N, T, ...)."""
    return x.reshape(x.shape[0], -1, n_slices, *x.shape[2:])


def axial_heads(
    params: dict, u: jax.Array, key_mask: jax.Array, extra: jax.Array | None = None, *, n_slices: int
) -> tuple[jax.Array, dict]:
    """Axial attention of the normalised stream u (B, P, D) on the windows' grid, T = ``n_slices``:
    Σ_h A^T_h · A^N_h · V_h (B, P, D) and the heads' tensors as :func:`attention.joint_heads`
    gives them (``weights``: the two hops' product, (B, H, P, K); a row sums to 1 where the query's
    slice has a token).
    ``extra`` must be None: a score term over the joint grid has no place in two hops."""
    if extra is not None:
        raise ValueError("axial attention takes no extra score term (score variants run on the joint grid)")
    batch, n_positions, width = u.shape
    n_tokens = n_positions // n_slices
    mask = _slices(key_mask, n_slices)  # (B, N, T)
    mask_n = jnp.swapaxes(mask, 1, 2).reshape(batch * n_slices, n_tokens)  # keys of each slice  (B·T, N)
    has_token = jnp.any(mask, axis=1)  # each slice has a token  (B, T)
    itself = jnp.eye(n_slices, dtype=bool) & has_token[:, None, :, None]  # the query's own cell  (B, 1, T, T)
    mask_t = (mask[:, :, None, :] | itself).reshape(batch * n_tokens, n_slices, n_slices)  # (B·N, T, T)
    out, heads = None, []
    for h in range(params["wq"].shape[0]):
        q = _slices(jnp.einsum("bpd,de->bpe", u, params["wq"][h]), n_slices)  # Q_h  (B, N, T, D)
        k = _slices(jnp.einsum("bkd,de->bke", u, params["wk"][h]), n_slices)  # K_h  (B, N, T, D)
        v = _slices(jnp.einsum("bkd,de->bke", u, params["wv"][h]), n_slices)  # V_h  (B, N, T, D)

        def by_slice(a):  # (B, N, T, D) → (B·T, N, D)
            return jnp.swapaxes(a, 1, 2).reshape(batch * n_slices, n_tokens, width)

        a_n = attention_weights(by_slice(q), by_slice(k), mask_n)  # A^N_h: within each slice  (B·T, N, N)
        within = jnp.einsum("bpk,bke->bpe", a_n, by_slice(v))  # A^N_h·V_h  (B·T, N, D)
        within = jnp.swapaxes(within.reshape(batch, n_slices, n_tokens, width), 1, 2)  # (B, N, T, D)

        def by_position(a):  # (B, N, T, D) → (B·N, T, D)
            return a.reshape(batch * n_tokens, n_slices, width)

        a_t = attention_weights(by_position(q), by_position(k), mask_t)  # A^T_h: across the slices  (B·N, T, T)
        o = jnp.einsum("bts,bse->bte", a_t, by_position(within))  # A^T_h·A^N_h·V_h  (B·N, T, D)
        o = o.reshape(batch, n_positions, width)  # (B, P, D)
        out = o if out is None else out + o  # Σ_h: summed, no output map  (B, P, D)
        a_n = a_n.reshape(batch, n_slices, n_tokens, n_tokens)  # [b, t', x, x']
        a_t = a_t.reshape(batch, n_tokens, n_slices, n_slices)  # [b, x, t, t']
        a = jnp.einsum("bxts,bsxy->bxtys", a_t, a_n).reshape(batch, n_positions, n_positions)  # (B, P, K)
        heads.append((q.reshape(u.shape), k.reshape(u.shape), v.reshape(u.shape), a))
    names = ("q", "k", "v", "weights")
    return out, {name: jnp.stack([head[i] for head in heads], axis=1) for i, name in enumerate(names)}


def attend(layer: dict, u: jax.Array, mask: jax.Array, extra: jax.Array | None = None, *, n_slices: int):
    """:func:`axial_heads` as a layer's sublayer receives them (``block.sublayer(grid="axial")``): the
    heads' sum (B, P, D), a zero auxiliary value and the two hops' weights (B, H, P, K). ``mask``: a
    key mask (B, K)."""
    if mask.ndim != 2:
        raise ValueError(f"axial attention takes a key mask (B, K), not a pairwise mask {mask.shape}")
    out, tensors = axial_heads(layer["attn"], u, mask, extra, n_slices=n_slices)
    return out, jnp.zeros((), u.dtype), tensors["weights"]
