"""How a token enters and leaves the rank-4 model's (dx, dt) fiber: the paper's outer product, or a
flat (unfactorised) vector, an ablation of the fibre factorisation (``Rank4Config.token_code``).

Axes: V vocabulary, dx/dt fibers, D = dx·dt, R rows (any leading axes).

- ``outer`` (the paper, SPEC §2 Stage A and §4): a token is Esem[v] ⊗ Etmp[v] (V·(dx + dt)
  parameters) and the tied, factorised readout scores Y against vec(Esem[v] ⊗ W′[v]).
- ``flat``: a token is one free vector E[v] of D numbers laid on the fiber, and the readout is tied
  to E (logits Y·E[v]ᵀ): the same grid, position codes (P[x] over n, R[x + t] over q), joint softmax
  and parallel prediction, without the factorisation (V·D parameters).

Each code gives its parameters (``init_embed`` and ``init_readout``: the ``embed`` and ``readout``
entries, the latter None for the flat code, whose parameters then have no ``readout`` entry), the token part of
the input tensor (``vectors``), the logits of the final-normed stream (``logits``) and the target's
logit straight from the parameters (``target_logits``).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from rank4jax.models.common import token_rows, wide_dtype
from rank4jax.models.rank4.readout import apply_readout, init_readout, logits_of, target_logits
from rank4jax.tokens import PAD_ID


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
