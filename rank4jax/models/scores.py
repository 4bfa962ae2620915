"""Attention-score variants: the one hook through which a variant (such as ZPX) joins a model.

A variant is a frozen, hashable object held by the model config (``cfg.score``), so it is bound
statically under jit. The paper's models (``rank4.model``, ``baseline.model``) call only the
methods below and never ask which variant they hold; :class:`StandardScore` is the paper's plain
content score and adds nothing. ``rank4jax.models.zpx.ZPXConfig`` is the geometric variant.

Axes: B batch, P query positions, K key positions (of a window's joint grid, or a sequence's slots),
Q new query slots of a cached decode, S cache slots, D model width.

    name                                 key of its per-layer parameters ("" when it has none)
    aux_weight                           weight of its auxiliary value in the training objective
    init_layer(key, width, dtype)        its parameters for one layer (None when it has none)
    export_shapes(width)                 {name under the layer, e.g. "zpx.w_r": shape} for SPEC §10 export
    scores(params, u, key_mask)          u (B, P, D) normalised stream, key_mask (B, K) →
                                         (extra (B, P, K) added to every head's score before the mask,
                                          or None; the layer's auxiliary value, a scalar)
    init_cache(batch, slots, dtype)      its entries in one layer's decode cache ({} when none)
    cached_scores(params, u, cache, start, real)
                                         u (B, Q, D) at slots [start, start+Q), real (B, Q) bool →
                                         (extra (B, Q, S) or None, its updated cache entries)
    cached_aux(caches)                   the auxiliary value at the end of a cached decode
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class StandardScore:
    """The paper's score: the scaled content score only. No parameters, no cache, no auxiliary term."""

    name = ""
    aux_weight = 0.0

    def init_layer(self, key: jax.Array, width: int, dtype) -> dict | None:
        del key, width, dtype
        return None

    def export_shapes(self, width: int) -> dict[str, tuple[int, ...]]:
        del width
        return {}

    def scores(self, params, u: jax.Array, key_mask: jax.Array) -> tuple[jax.Array | None, jax.Array]:
        del params, key_mask
        return None, jnp.zeros((), u.dtype)

    def init_cache(self, batch: int, slots: int, dtype) -> dict:
        del batch, slots, dtype
        return {}

    def cached_scores(self, params, u, cache: dict, start, real) -> tuple[jax.Array | None, dict]:
        del params, u, cache, start, real
        return None, {}

    def cached_aux(self, caches: list) -> jax.Array:
        del caches
        return jnp.zeros(())


STANDARD = StandardScore()


def layer_params(variant, layer: dict):
    """The variant's parameters inside one layer's parameter dict (None when it has none)."""
    return layer.get(variant.name) if variant.name else None


def init_layer_params(variant, layer_key: jax.Array, width: int, dtype) -> dict:
    """{name: params} to merge into a layer's parameters; a key of its own (folded from the layer's),
    so the standard parameters are the same with or without the variant."""
    params = variant.init_layer(jax.random.fold_in(layer_key, 7), width, dtype)
    return {} if params is None else {variant.name: params}
