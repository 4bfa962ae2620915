"""The one small interface through which training and evaluation drive a model family.

A family turns a run config's ``model`` section into a static model config and provides pure
functions over (params, windows). Windows are int32 (B, T+1, N): inputs S(0..T-1), targets
S(1..T). ``loss_sums`` returns additive sums (see ``rank4jax.models.rank4.losses``) so metrics
aggregate exactly over batches; ``objective`` is the training loss.

Later families (the 1-D baseline, ZPX attention, …) register a sibling :class:`ModelFamily`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from rank4jax.errors import ConfigError
from rank4jax.models import rank4


@dataclasses.dataclass(frozen=True)
class ModelFamily:
    name: str
    make_config: Callable[[Mapping, int], Any]  # (model section, vocab size) → hashable model config
    init: Callable[[jax.Array, Any], Any]  # (key, cfg) → params
    loss_sums: Callable[..., dict]  # (params, windows, cfg, *, train, rng) → sums incl. "objective"
    predict_last: Callable[[Any, jax.Array, Any], jax.Array]  # (params, inputs (B,T,N), cfg) → Ŝ(T) (B, N)
    last_slice_ce: Callable[[Any, jax.Array, Any], jax.Array]  # (params, windows, cfg) → (B,) mean CE of S(T)
    count_params: Callable[[Any], int]


def _rank4_config(section: Mapping, vocab_size: int) -> rank4.Rank4Config:
    fields = ("n_tokens", "n_slices", "dx", "dt", "n_heads", "n_layers", "dropout", "attention")
    return rank4.Rank4Config(vocab_size=vocab_size, **{f: section[f] for f in fields})


def _rank4_loss_sums(params, windows, cfg, *, train=False, rng=None) -> dict:
    logits = rank4.forward(params, windows[:, :-1], cfg, train=train, rng=rng)
    sums = rank4.window_loss_sums(logits, windows[:, 1:])
    sums["objective"] = sums["window_ce_sum"] / jnp.maximum(sums["window_tokens"], 1)
    return sums


def _rank4_predict_last(params, inputs, cfg):
    logits = rank4.forward(params, inputs, cfg)  # (B, N, T, V)
    return jnp.argmax(logits[:, :, -1], axis=-1).astype(jnp.int32)


def _rank4_last_slice_ce(params, windows, cfg):
    return rank4.last_slice_mean_ce(rank4.forward(params, windows[:, :-1], cfg), windows[:, 1:])


RANK4 = ModelFamily(
    name="rank4",
    make_config=_rank4_config,
    init=rank4.init_params,
    loss_sums=_rank4_loss_sums,
    predict_last=_rank4_predict_last,
    last_slice_ce=_rank4_last_slice_ce,
    count_params=rank4.count_params,
)

FAMILIES = {RANK4.name: RANK4}


def get_family(name: str) -> ModelFamily:
    if name not in FAMILIES:
        raise ConfigError(f"model_family must be one of {sorted(FAMILIES)}, got {name!r}")
    return FAMILIES[name]
