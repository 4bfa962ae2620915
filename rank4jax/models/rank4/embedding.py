"""Input tensor of the rank-4 model (SPEC §2).

Axes: B batch, N tokens per state (x), T input slices (t), dx semantic fiber (n), dt temporal
fiber (q), V vocabulary.

    X[b,x,t,n,q] = Esem[tok[b,t,x], n] · Etmp[tok[b,t,x], q] + P[x, n] + R[x + t, q]
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np

from rank4jax.models.common import sinusoid_table
from rank4jax.models.rank4.config import Rank4Config
from rank4jax.models.rank4.layout import window_rows


def init_embedding(key: jax.Array, cfg: Rank4Config, dtype=jnp.float32) -> dict:
    """The token code's input parameters (SPEC §5; the paper's: Esem (V, dx), Etmp (V, dt) ~ N(0, 1)
    with the PAD row zero)."""
    return cfg.tokens.init_embed(key, cfg.vocab_size, cfg.dx, cfg.dt, dtype)


def grid_position_tables(n_tokens: int, n_slices: int, dx: int, dt: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    """Fixed tables of an (N, T) grid (SPEC §2 Stages B and D): P (N, dx) over the position x, added
    to every q, and R[x + t] (N, T, dt) over the joint phase, added to every n."""
    spatial = sinusoid_table(n_tokens, dx)  # P (N, dx)
    joint = sinusoid_table(n_tokens + n_slices, dt)  # R (N+T, dt)
    phase = np.arange(n_tokens)[:, None] + np.arange(n_slices)[None, :]  # (N, T)
    return spatial.astype(dtype), joint[phase].astype(dtype)


def position_tables(cfg: Rank4Config, dtype) -> tuple[np.ndarray, np.ndarray]:
    """:func:`grid_position_tables` of the model's window: P (N, dx) and R[x+t] (N, T, dt)."""
    return grid_position_tables(cfg.n_tokens, cfg.n_slices, cfg.dx, cfg.dt, dtype)


def embed_rows(params: dict, rows, cfg: Rank4Config) -> jax.Array:
    """X at the rows of a layout (``rank4jax.models.rank4.layout.Rows``): (G, R, D) flattened fibers,

    X = token(tok) + P[x] (every q) + R[x + t] (every n),   token = Esem ⊗ Etmp (the paper's code)."""
    dtype = jax.tree_util.tree_leaves(params)[0].dtype
    spatial, joint = position_tables(cfg, dtype)  # P (N, dx), R[x+t] (N, T, dt)
    # on one row axis, for the reason common.on_rows gives: XLA:CPU reduces the outer product's
    # backward (R, dx, dt) → (R, dx) several times faster than with the leading group axis kept apart
    tok, position, slice_ = (a.reshape(-1) for a in (rows.tokens, rows.position, rows.slice))
    x = cfg.tokens.vectors(params, tok, (cfg.dx, cfg.dt))  # Stage A: the token  (G·R, dx, dt)
    x = x + jnp.asarray(spatial)[position][:, :, None]  # Stage B: P[x, n], same for every q
    x = x + jnp.asarray(joint)[position, slice_][:, None, :]  # Stage D: R[x + t, q], same for every n
    return x.reshape(rows.tokens.shape + (cfg.width,))


def apply_embedding(params: dict, tok: jax.Array, cfg: Rank4Config) -> jax.Array:
    """tok (B, N, T) int → X (B, N, T, dx, dt) in the parameters' dtype: :func:`embed_rows` of the
    windows' rows (p = x·T + t), so the same values as the forward's."""
    batch = tok.shape[0]
    chex.assert_shape(tok, (batch, cfg.n_tokens, cfg.n_slices))
    x = embed_rows(params, window_rows(jnp.swapaxes(tok, 1, 2)), cfg)  # (B, P, D)
    return x.reshape(batch, cfg.n_tokens, cfg.n_slices, cfg.dx, cfg.dt)
