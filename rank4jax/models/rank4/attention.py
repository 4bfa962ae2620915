"""Rank-4 attention (SPEC §3): H heads over each window's joint (N, T) key grid.

Axes: B windows, H heads, P = N·T query cells (x, t) and K = N·T key cells (x', t') of the grid,
D = dx·dt the flattened fiber φ(n, q) = n·dt + q.

Every head keeps the full fiber: its Q/K/V maps are D → D (no bias). The score contracts both
fibers, scaled by 1/sqrt(D); a score term shared by the heads (``extra``: a variant's, or a user's)
is added; masked keys get the dtype's finite minimum; one softmax runs jointly over the N·T key
grid (``common.masked_softmax``); the heads' outputs are summed (no 1/sqrt(H), no output map).

Masks (the one argument every entry takes; ``grid_mask`` builds it from a user's): a key mask
(B, K) — True where the cell is a key, for every query — or a pairwise mask (B, P, K), or one per
head (B, H, P, K); a leading 1 broadcasts.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from rank4jax.models.common import explicit_mesh, fan_in_uniform, masked_softmax


def init_attention(key: jax.Array, n_heads: int, width: int, dtype=jnp.float32, kernel_init=fan_in_uniform) -> dict:
    """WQ, WK, WV each (H, D, D) for D = ``width`` = dx·dt, input fiber first, drawn by ``kernel_init``
    (SPEC §5's U(±1/sqrt(D)) by default)."""
    keys = jax.random.split(key, 3)
    shape = (n_heads, width, width)
    return {name: kernel_init(k, shape, dtype) for name, k in zip(("wq", "wk", "wv"), keys, strict=True)}


def attention_weights(q: jax.Array, k: jax.Array, mask: jax.Array, extra: jax.Array | None = None) -> jax.Array:
    """Joint-softmax weights of one head (q, k (B, P, D)) or all (q, k (B, H, P, D)) → (B, [H,] P, K).

    ``mask`` (B, K) bool, or (B, P, K) for keys that depend on the query; ``extra`` (B, P, K): a score
    term shared by every head, added before the mask. A query with no allowed key gets zero weights
    (so a zero output): never a masked cell, nor, under a causal mask, a later one."""
    heads = (1,) * (q.ndim - 3)  # broadcast over a head axis when there is one
    scale = 1.0 / jnp.sqrt(jnp.asarray(q.shape[-1], q.dtype))
    scores = jnp.einsum("...pd,...kd->...pk", q, k) * scale
    if extra is not None:
        scores = scores + extra.reshape(extra.shape[:1] + heads + extra.shape[1:])
    mask = mask[:, None, :] if mask.ndim == 2 else mask  # (B, P or 1, K)
    mask = mask.reshape(mask.shape[:1] + heads + mask.shape[1:])
    weights = masked_softmax(scores, mask)  # uniform over every cell where no key is allowed
    return weights * jnp.any(mask, axis=-1, keepdims=True).astype(weights.dtype)  # zero there


def joint_heads(attn: dict, u: jax.Array, mask: jax.Array, extra: jax.Array | None = None) -> tuple[jax.Array, dict]:
    """Rank-4 attention of the normalised stream u (B, P, D) over each window's joint key grid: the one
    implementation, which the trainer, the §6 check and ``rank4jax.nn`` all run.

    ``mask``: as the module docstring says; ``extra`` (B, P, K) or None. Returns Σ_h O_h (B, P, D) and
    the heads' tensors stacked on a head axis: ``q``, ``k``, ``v`` (B, H, P, D) and ``weights`` A
    (B, H, P, K) (unused ones cost nothing under jit). The heads are taken one at a time, each a (D, D)
    map of the rows: on XLA:CPU 10–17 % faster than one einsum over H (docs/layers.md)."""
    maps = {name: _whole(w) for name, w in attn.items()}  # (H, D, D) each
    if mask.ndim == 4 and mask.shape[1] not in (1, maps["wq"].shape[0]):
        raise ValueError(
            f"a per-head mask (B, H, P, K) has {mask.shape[1]} heads; the attention has {maps['wq'].shape[0]}"
        )
    out, heads = None, []
    for h in range(maps["wq"].shape[0]):
        q = jnp.einsum("bpd,de->bpe", u, maps["wq"][h])  # Q_h = U·WQ_h   (B, P, D)
        k = jnp.einsum("bkd,de->bke", u, maps["wk"][h])  # K_h = U·WK_h   (B, K, D)
        v = jnp.einsum("bkd,de->bke", u, maps["wv"][h])  # V_h = U·WV_h   (B, K, D)
        a = attention_weights(q, k, _of_head(mask, h), extra)  # A_h: one softmax over the N·T keys (B, P, K)
        o = jnp.einsum("bpk,bke->bpe", a, v)  # O_h = A_h·V_h  (B, P, D)
        out = o if out is None else out + o  # Σ_h O_h: summed, no output map (B, P, D)
        heads.append((q, k, v, a))
    names = ("q", "k", "v", "weights")
    return out, {name: jnp.stack([head[i] for head in heads], axis=1) for i, name in enumerate(names)}


def attend(layer: dict, u: jax.Array, mask: jax.Array, extra: jax.Array | None = None):
    """The paper's heads as a layer's sublayer receives them (``block.Sublayer.attend``): Σ_h O_h
    (B, P, D), the auxiliary value (none: 0) and the weights A (B, H, P, K)."""
    out, tensors = joint_heads(layer["attn"], u, mask, extra)
    return out, jnp.zeros((), u.dtype), tensors["weights"]


def _whole(w: jax.Array) -> jax.Array:
    """``w`` whole on every device for the head loop: on a mesh with Explicit axes that splits the head
    axis, gathered (a head cannot be sliced off a split axis there); elsewhere as it is (XLA's
    partitioner places the slices)."""
    return jax.sharding.reshard(w, PartitionSpec()) if explicit_mesh() else w


def _of_head(mask: jax.Array, h: int) -> jax.Array:
    """Head h's part of a mask: (B, K) and (B, P, K) are every head's; (B, H or 1, P, K) is sliced."""
    return mask[:, min(h, mask.shape[1] - 1)] if mask.ndim == 4 else mask


def grid_mask(mask, x_shape: tuple, owner: str, is_causal: bool = False, causal_axis: int = -1) -> jax.Array:
    """The mask the heads take, from a user's, for a stream of ``x_shape`` (B, *grid, dx, dt):

    - None: every cell a key, (1, K);
    - a key mask broadcastable to (B, *grid), True where the cell is a key → (B or 1, K);
    - a pairwise mask (B, P, K) or (B, H, P, K) over the cells in C order (leading 1s broadcast), as
      ``flax.nnx.MultiHeadAttention`` takes one — used when the mask does not broadcast to (B, *grid);
    - ``is_causal``: each query sees only the keys at or before its own index along the grid axis
      ``causal_axis`` (the stories' (N, T) grid: -1, the slices; frames × patches: 0, the frames),
      combined with the mask → (B or 1, [H,] P, K)."""
    grid_shape = tuple(x_shape[:-2])  # (B, *grid)
    cells = int(np.prod(grid_shape[1:]))
    if mask is None:
        keys = jnp.ones((1, cells), bool)
    else:
        mask = jnp.asarray(mask)
        if mask.dtype != jnp.bool_:
            raise ValueError(f"{owner}: mask must be bool (True: the cell is a key), got {mask.dtype}")
        if _broadcasts(mask.shape, grid_shape):
            mask = mask.reshape((1,) * (len(grid_shape) - mask.ndim) + mask.shape)
            keys = jnp.broadcast_to(mask, mask.shape[:1] + grid_shape[1:]).reshape(mask.shape[0], cells)
        elif mask.ndim in (3, 4) and _broadcasts(mask.shape, (x_shape[0],) + mask.shape[1:-2] + (cells, cells)):
            keys = mask  # pairwise
        else:
            raise ValueError(
                f"{owner}: mask of shape {mask.shape} does not broadcast to (B, *grid) = {grid_shape}, nor is it "
                f"a pairwise mask (B, [H,] P, K) = ({grid_shape[0]}, [H,] {cells}, {cells})"
            )
    if not is_causal:
        return keys
    return _causal(keys, grid_shape[1:], causal_axis, owner)


def _broadcasts(shape: tuple, target: tuple) -> bool:
    try:
        return np.broadcast_shapes(shape, target) == target and len(shape) <= len(target)
    except ValueError:
        return False


def _causal(keys: jax.Array, grid: tuple, causal_axis: int, owner: str) -> jax.Array:
    """``keys`` (B, K) or (B, [H,] P, K) and the causal order along ``causal_axis`` of ``grid``."""
    if not -len(grid) <= causal_axis < len(grid):
        raise ValueError(f"{owner}: causal_axis={causal_axis} is not an axis of the {len(grid)}-axis grid {grid}")
    axis = causal_axis % len(grid)
    index = np.arange(grid[axis]).reshape([-1 if a == axis else 1 for a in range(len(grid))])
    index = np.broadcast_to(index, grid).reshape(-1)  # each cell's index along the causal axis (P,)
    order = jnp.asarray(index[None, :] <= index[:, None])  # (P, K): a key at or before the query
    if keys.ndim == 2:
        return keys[:, None, :] & order[None]  # (B or 1, P, K)
    return keys & order  # (B or 1, [H,] P, K)


def rank4_attention(params: dict, x: jax.Array, mask=None, *, extra=None, is_causal=False, causal_axis=-1):
    """Rank-4 attention (SPEC §3) of a normalised stream x (B, *grid, dx, dt) — the stories' grid is
    (N, T); any other grid (frames × patches, …) works the same — → Σ_h O_h (B, *grid, dx, dt).

    What it is: full-width multi-head attention over the flattened key grid with D-vector tokens
    (D = dx·dt): each head's WQ_h, WK_h, WV_h is a dense (D, D) map of the whole fiber, one softmax
    runs over every cell of the grid whatever its place, and the heads are summed with no output map
    (3·H·D² parameters, where standard attention of width D has 4·D²). On a (6, 8) grid of (4, 4)
    fibers it is exactly the attention over 48 cells of (16, 1) fibers; the paper's rank-4 structure
    is in the token code, the position codes and the readout around it.

    ``params``: {wq, wk, wv} (H, D, D) (``init_attention``); ``mask``, ``is_causal``, ``causal_axis``
    as :func:`grid_mask`; ``extra`` (B, P, K) over the grid flattened in C order, or None."""
    out, _ = joint_heads(params, *_on_flat_grid(x, mask, is_causal, causal_axis), extra)  # (B, P, D)
    return out.reshape(x.shape)  # (B, *grid, dx, dt)


def rank4_attention_weights(params: dict, x: jax.Array, mask=None, *, extra=None, is_causal=False, causal_axis=-1):
    """The heads' attention weights of :func:`rank4_attention`: (B, H, *grid, *grid), [b, h, query
    cell, key cell]."""
    grid = x.shape[1:-2]
    _, heads = joint_heads(params, *_on_flat_grid(x, mask, is_causal, causal_axis), extra)
    return heads["weights"].reshape(heads["weights"].shape[:2] + grid + grid)  # (B, H, *grid, *grid)


def _on_flat_grid(x: jax.Array, mask, is_causal: bool, causal_axis: int) -> tuple[jax.Array, jax.Array]:
    """x (B, *grid, dx, dt) and a user's mask → (B, P, D) and the heads' mask: grid flattened in C order."""
    return x.reshape(x.shape[0], -1, x.shape[-2] * x.shape[-1]), grid_mask(
        mask, x.shape, "rank4_attention", is_causal, causal_axis
    )
