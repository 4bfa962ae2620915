"""How tokens and positions enter the rank-4 model's (dx, dt) fiber, and how the stream leaves it
(SPEC §2, §4): the token code, the position code and the tied readout.

Axes: B batch, N tokens per state (x), T input slices (t), G/R the groups and rows of a layout
(``rank4jax.models.rank4.layout``), dx semantic fiber (n), dt temporal fiber (q), D = dx·dt the
flattened fiber φ(n, q) = n·dt + q, V vocabulary.

    X[x, t] = token(tok[t, x]) + P[x, n] (every q) + R[x + t, q] (every n)       the input tensor
    logits[p, v] = Σ_φ Y[p, φ] · M[φ, v]                                         the tied readout

Token codes (``Rank4Config.token_code``): ``outer``, the paper's, a token is Esem[v] ⊗ Etmp[v] and
M[φ(n,q), v] = Esem[v, n]·W′[v, q] (never an O(B·P·dt·V) intermediate; M is V·D); ``flat``, an
ablation of the factorisation, a token is a free vector E[v] of D numbers laid on the fiber and the
readout is tied to E. Each code gives its parameters (``init_embed``, ``init_readout``: the
``embed`` and ``readout`` entries, the latter None for the flat code), the token part of X
(``vectors``), the logits of the final-normed stream (``logits``) and the target's logit straight
from the parameters (``target_logits``: no gradient through an index into the logits).
"""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np

from rank4jax.models.common import on_rows, sinusoid_table, token_rows, wide_dtype
from rank4jax.models.rank4.layout import window_rows
from rank4jax.tokens import PAD_ID

# ------------------------------------------------------------------------------------------------
# the position code (SPEC §2 Stages B and D)


def grid_position_tables(n_tokens: int, n_slices: int, dx: int, dt: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    """Fixed tables of an (N, T) grid: P (N, dx) over the position x, added to every q, and R[x + t]
    (N, T, dt) over the joint phase, added to every n."""
    spatial = sinusoid_table(n_tokens, dx)  # P (N, dx)
    joint = sinusoid_table(n_tokens + n_slices, dt)  # R (N+T, dt)
    phase = np.arange(n_tokens)[:, None] + np.arange(n_slices)[None, :]  # (N, T)
    return spatial.astype(dtype), joint[phase].astype(dtype)


def embed_rows(embed: dict, rows, cfg) -> jax.Array:
    """X at the rows of a layout (``layout.Rows``) from the token code's ``embed`` parameters: (G, R, D)
    flattened fibers (SPEC §2, Stages A–D)."""
    dtype = jax.tree_util.tree_leaves(embed)[0].dtype
    spatial, joint = grid_position_tables(cfg.n_tokens, cfg.n_slices, cfg.dx, cfg.dt, dtype)
    # on one row axis, for the reason common.on_rows gives: XLA:CPU reduces the outer product's
    # backward (R, dx, dt) → (R, dx) several times faster than with the leading group axis kept apart
    tok, position, slice_ = (a.reshape(-1) for a in (rows.tokens, rows.position, rows.slice))
    x = cfg.tokens.vectors(embed, tok, (cfg.dx, cfg.dt))  # Stage A: the token  (G·R, dx, dt)
    x = x + jnp.asarray(spatial)[position][:, :, None]  # Stage B: P[x, n], same for every q
    x = x + jnp.asarray(joint)[position, slice_][:, None, :]  # Stage D: R[x + t, q], same for every n
    return x.reshape(rows.tokens.shape + (cfg.width,))


def apply_embedding(embed: dict, tok: jax.Array, cfg) -> jax.Array:
    """tok (B, N, T) int → X (B, N, T, dx, dt) in the parameters' dtype: :func:`embed_rows` of the
    windows' rows (p = x·T + t), so the same values as the forward's."""
    batch = tok.shape[0]
    chex.assert_shape(tok, (batch, cfg.n_tokens, cfg.n_slices))
    x = embed_rows(embed, window_rows(jnp.swapaxes(tok, 1, 2)), cfg)  # (B, P, D)
    return x.reshape(batch, cfg.n_tokens, cfg.n_slices, cfg.dx, cfg.dt)


# ------------------------------------------------------------------------------------------------
# the readout (SPEC §4)


def init_readout(key: jax.Array, vocab_size: int, dt: int, width: int, dtype=jnp.float32) -> dict:
    """W′ (V, dt) ~ N(0, 1/D) so initial logits have unit scale (SPEC §5)."""
    return {"tmp": jax.random.normal(key, (vocab_size, dt), dtype) / jnp.sqrt(jnp.asarray(width, dtype))}


def readout_matrix(sem: jax.Array, tmp: jax.Array) -> jax.Array:
    """M as (V, D): row v is vec(Esem[v] ⊗ W′[v]) in φ order."""
    vocab, dx = sem.shape
    return (sem[:, :, None] * tmp[:, None, :]).reshape(vocab, dx * tmp.shape[1])


def apply_readout(sem: jax.Array, tmp: jax.Array, y: jax.Array) -> jax.Array:
    """y (B, P, D) final-normed stream → logits (B, P, V) through M (Esem (V, dx), W′ (V, dt))."""
    with jax.named_scope("readout"):
        m = readout_matrix(sem, tmp)  # (V, D)
        chex.assert_shape(y, y.shape[:2] + (m.shape[1],))
        return logits_of(y, m)


def logits_of(y: jax.Array, m: jax.Array) -> jax.Array:
    """y (..., D) against the readout matrix M (V, D) → logits (..., V), in at least float32
    (accumulated there from bfloat16 inputs): the CE's logsumexp needs them."""
    return on_rows(lambda rows: jnp.matmul(rows, m.T, preferred_element_type=wide_dtype(y)), y)


def target_logits(sem: jax.Array, tmp: jax.Array, y: jax.Array, targets: jax.Array) -> jax.Array:
    """logits[b, p, targets[b, p]] without touching the logits: Σ_{n,q} Y[b,p,(n,q)]·Esem[v,n]·W′[v,q].

    y (B, P, D); targets (B, P) int → (B, P). Gathers B·P rows of the (V, dx) and (V, dt) factors."""
    dx, dt = sem.shape[1], tmp.shape[1]
    chex.assert_shape(y, targets.shape + (dx * dt,))
    fibers = y.reshape(targets.shape + (dx, dt))
    # Y·W′[v] contracted over q by a matmul, accumulated in at least float32 as the logits are; then Esem[v]
    per_n = jnp.einsum("bpnq,bpq->bpn", fibers, tmp[targets], preferred_element_type=wide_dtype(y))
    return jnp.sum(per_n * sem[targets], axis=-1)


# ------------------------------------------------------------------------------------------------
# the token codes


@dataclasses.dataclass(frozen=True)
class OuterProduct:
    """The paper's: Esem (V, dx), Etmp (V, dt) ~ N(0, 1) with the PAD row zero, W′ (V, dt) ~ N(0, 1/D)."""

    name = "outer"

    def init_embed(self, key: jax.Array, vocab: int, dx: int, dt: int, dtype) -> dict:
        """The ``embed`` entry of the parameters (SPEC §5)."""
        k_sem, k_tmp = jax.random.split(key)
        sem = jax.random.normal(k_sem, (vocab, dx), dtype).at[PAD_ID].set(0)
        tmp = jax.random.normal(k_tmp, (vocab, dt), dtype).at[PAD_ID].set(0)
        return {"sem": sem, "tmp": tmp}

    def init_readout(self, key: jax.Array, vocab: int, dx: int, dt: int, dtype) -> dict:
        """The ``readout`` entry: W′ (SPEC §5)."""
        return init_readout(key, vocab, dt, dx * dt, dtype)

    def vectors(self, embed: dict, tok: jax.Array, fiber: tuple[int, int]) -> jax.Array:
        """tok (...) → Esem[tok] ⊗ Etmp[tok] (..., dx, dt) (Stage A)."""
        del fiber  # the factors' widths
        sem = token_rows(embed["sem"], tok)  # (..., dx); NaN for an id outside [0, V)
        tmp = token_rows(embed["tmp"], tok)  # (..., dt)
        return sem[..., :, None] * tmp[..., None, :]

    def logits(self, params: dict, y: jax.Array) -> jax.Array:
        """y (B, R, D) → (B, R, V) through vec(Esem[v] ⊗ W′[v])."""
        return apply_readout(params["embed"]["sem"], params["readout"]["tmp"], y)

    def target_logits(self, params: dict, y: jax.Array, targets: jax.Array) -> jax.Array:
        return target_logits(params["embed"]["sem"], params["readout"]["tmp"], y, targets)

    def export_shapes(self, vocab: int, dx: int, dt: int) -> dict[str, tuple[int, ...]]:
        return {"embed.sem": (vocab, dx), "embed.tmp": (vocab, dt), "readout.tmp": (vocab, dt)}


@dataclasses.dataclass(frozen=True)
class Flat:
    """A free vector per token: E (V, D) ~ N(0, 1/D) with the PAD row zero, so the tied logits start
    at unit scale as the paper's do; no separate readout parameters."""

    name = "flat"

    def init_embed(self, key: jax.Array, vocab: int, dx: int, dt: int, dtype) -> dict:
        width = dx * dt
        table = jax.random.normal(key, (vocab, width), dtype) / jnp.sqrt(jnp.asarray(width, dtype))
        return {"tok": table.at[PAD_ID].set(0)}

    def init_readout(self, key: jax.Array, vocab: int, dx: int, dt: int, dtype) -> None:
        """None: the readout is tied to E."""
        del key, vocab, dx, dt, dtype

    def vectors(self, embed: dict, tok: jax.Array, fiber: tuple[int, int]) -> jax.Array:
        """tok (...) → E[tok] laid on the fiber (..., dx, dt)."""
        return token_rows(embed["tok"], tok).reshape(tok.shape + fiber)

    def logits(self, params: dict, y: jax.Array) -> jax.Array:
        """y (B, R, D) → (B, R, V) through E (V, D), the input table."""
        with jax.named_scope("readout"):
            return logits_of(y, params["embed"]["tok"])

    def target_logits(self, params: dict, y: jax.Array, targets: jax.Array) -> jax.Array:
        rows = params["embed"]["tok"][targets]  # (..., R, D)
        return jnp.einsum("...d,...d->...", y, rows, preferred_element_type=wide_dtype(y))

    def export_shapes(self, vocab: int, dx: int, dt: int) -> dict[str, tuple[int, ...]]:
        return {"embed.tok": (vocab, dx * dt)}


TOKEN_CODES = {"outer": OuterProduct(), "flat": Flat()}
