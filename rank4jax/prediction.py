"""The next sentence of a story a user types, for any trained run (``predict.py``)::

    run = rank4jax.load_run("runs/default")
    prediction = rank4jax.predict_next(run, ["Tom had a dog.", "...", "...", "..."])
    print(prediction.states[0].text)

What the predicted state is depends on the family (``ModelFamily.prediction``): the rank-4 model
gives the per-position argmax of S(T), every token at once; the baseline decodes S(T) free-running;
the stream LMs decode it token by token after the story. ``rollout=K`` predicts K further states,
each window dropping its oldest sentence and appending the prediction; ``temperature`` / ``top_k``
sample the decoding families' tokens (greedy by default).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np

from rank4jax.data.windows import encode_state
from rank4jax.engine.run_config import check_seed
from rank4jax.engine.sharding import check_window_fits
from rank4jax.errors import ConfigError
from rank4jax.models import decoding
from rank4jax.models.family import get_family
from rank4jax.tokens import EOS_ID, PAD_ID, UNK_ID

_SENTENCE_FINAL = re.compile(r"^[.!?]$")


@dataclasses.dataclass(frozen=True)
class PredictedState:
    text: str  # the state decoded (the rank-4 model's: cut after its first sentence-final token)
    tokens: tuple[tuple[str, float], ...]  # each shown token and the model's probability of it


@dataclasses.dataclass(frozen=True)
class Prediction:
    inputs: tuple[str, ...]  # the T context sentences as the tokenizer reads them ([UNK:word] marked)
    unknown: int  # context tokens outside the vocabulary
    cut: int  # context sentences longer than N tokens (cut to N)
    dropped: int  # sentences before the last T (not read)
    states: tuple[PredictedState, ...]  # Ŝ(T), then one per rollout step
    kind: str  # what a predicted state is, for this family and decoding


@functools.partial(jax.jit, static_argnames=("family_name", "cfg", "temperature", "top_k"))
def _next_state(params, inputs, key, *, family_name, cfg, temperature, top_k):
    family = get_family(family_name)
    choose = decoding.sampler(key, temperature, top_k) if family.decodes else None
    return family.next_state(params, inputs, cfg, choose)


def _check(run, sentences, rollout, temperature, top_k, seed=0) -> None:
    check_seed("seed", seed)
    check_window_fits(run.model_cfg.n_tokens, run.model_cfg.n_slices, run.model_cfg.vocab_size)
    family = run.family
    if isinstance(sentences, str) or not sentences or not all(isinstance(s, str) and s.strip() for s in sentences):
        raise ConfigError("predict_next needs a list of non-empty sentences")
    n_slices = run.model_cfg.n_slices
    if len(sentences) < n_slices:
        raise ConfigError(f"this {family.name} model reads T = {n_slices} sentences; got {len(sentences)}")
    if isinstance(rollout, bool) or not isinstance(rollout, int) or rollout < 0:
        raise ConfigError(f"rollout must be a non-negative integer, got {rollout!r}")
    if not (isinstance(temperature, int | float) and math.isfinite(temperature) and temperature >= 0):
        raise ConfigError(f"temperature must be a non-negative finite number (0 = greedy), got {temperature!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ConfigError(f"top_k must be a non-negative integer (0 = every token), got {top_k!r}")
    if top_k > run.tokenizer.vocab_size:
        raise ConfigError(f"top_k={top_k} is more than the model's {run.tokenizer.vocab_size} tokens (0 = every token)")
    if top_k and not temperature:
        raise ConfigError("top_k applies when sampling: give a temperature > 0 as well")
    if not family.decodes and (temperature or top_k):
        raise ConfigError(
            f"the {family.name} model decodes nothing ({family.prediction}): temperature and top_k do not apply"
        )


def token_view(tokenizer, sentence: str, n_tokens: int) -> tuple[str, int, bool]:
    """(the sentence as the model reads it, its UNK count, whether it was cut to N tokens)."""
    pieces = tokenizer.pieces(sentence)
    shown = [f"[UNK:{p}]" if i == UNK_ID else p for p, i in pieces[:n_tokens]]
    return " ".join(shown), sum(i == UNK_ID for _, i in pieces[:n_tokens]), len(pieces) > n_tokens


def _state(tokenizer, tokens: np.ndarray, probs: np.ndarray, cut_at_sentence_end: bool) -> PredictedState:
    shown = []
    for token, prob in zip(tokens.tolist(), probs.tolist(), strict=True):
        if token in (PAD_ID, EOS_ID):
            break
        shown.append((tokenizer.piece(token), float(prob)))
        if cut_at_sentence_end and _SENTENCE_FINAL.match(shown[-1][0]):
            break
    ids = tokens[: len(shown)]
    return PredictedState(tokenizer.decode(ids), tuple(shown))


def predict_next(run, sentences, rollout: int = 0, temperature: float = 0.0, top_k: int = 0, seed: int = 0):
    """The next state after the last T of ``sentences`` (a ``rank4jax.load_run`` run), and ``rollout``
    more; a :class:`Prediction`. Sampling (``temperature`` > 0, ``top_k``) draws from ``seed``."""
    _check(run, sentences, rollout, temperature, top_k, seed)
    cfg, tokenizer, family = run.model_cfg, run.tokenizer, run.family
    context = list(sentences[-cfg.n_slices :])
    views = [token_view(tokenizer, s, cfg.n_tokens) for s in context]
    window = np.stack([encode_state(tokenizer, s, cfg.n_tokens) for s in context])[None]  # (1, T, N)
    params = jax.tree.map(jnp.asarray, run.params)
    key, states = jax.random.key(seed), []
    static = {"family_name": family.name, "cfg": cfg, "temperature": float(temperature), "top_k": top_k}
    for step in range(rollout + 1):
        tokens, probs = jax.device_get(_next_state(params, window, jax.random.fold_in(key, step), **static))
        states.append(_state(tokenizer, tokens[0], probs[0], cut_at_sentence_end=not family.decodes))
        window = np.concatenate([window[:, 1:], tokens[:, None].astype(np.int32)], axis=1)
    kind = family.prediction
    if family.decodes:
        kind += (
            f"; sampled at temperature {temperature:g}{f', top {top_k}' if top_k else ''}"
            if temperature
            else " (greedy)"
        )
    return Prediction(
        inputs=tuple(v[0] for v in views),
        unknown=sum(v[1] for v in views),
        cut=sum(v[2] for v in views),
        dropped=len(sentences) - len(context),
        states=tuple(states),
        kind=kind,
    )
