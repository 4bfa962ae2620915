"""Windows as token streams, for the next-token families (SPLM and the matched attention LM).

Axes: B batch, T context sentences, N tokens per sentence, S = (T+1)·N + 1 stream slots, V vocabulary.

A window (B, T+1, N) of states S(0..T) becomes one stream: BOS, the non-PAD tokens of S(0..T) in
order, EOS, then PAD. The model reads slots [0, S) and predicts the next token at each; targets are
the stream shifted by one. ``last`` marks the targets that are tokens of S(T) (not EOS), the same
tokens as the rank-4 LS(T), so the next-token families report a comparable "last slice" CE.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import optax

from rank4jax.models import decoding
from rank4jax.models.losses import row_mean, target_ce_sums
from rank4jax.tokens import BOS_ID, EOS_ID, PAD_ID


def stream_slots(n_tokens: int, n_slices: int) -> int:
    """S = (T+1)·N + 1 input slots (BOS + every token); the targets add EOS."""
    return (n_slices + 1) * n_tokens + 1


def pack_stream(windows: jax.Array) -> dict:
    """windows (B, T+1, N) → inputs (B, S), targets (B, S), last (B, S) bool."""
    batch, states, n_tokens = windows.shape
    flat = windows.reshape(batch, states * n_tokens)
    order = jnp.argsort(flat == PAD_ID, axis=1, stable=True)
    body = jnp.take_along_axis(flat, order, axis=1)  # non-PAD tokens first, order kept
    length = jnp.sum(flat != PAD_ID, axis=1)  # (B,)
    last_len = jnp.sum(windows[:, -1] != PAD_ID, axis=1)
    slots = jnp.arange(states * n_tokens + 1)[None]
    padded = jnp.concatenate([body, jnp.zeros((batch, 1), body.dtype)], axis=1)
    # an all-PAD window (eval padding row) has no stream at all: no BOS input, no EOS target
    real = length[:, None] > 0
    targets = jnp.where((slots == length[:, None]) & real, EOS_ID, padded)
    inputs = jnp.concatenate([jnp.where(real, BOS_ID, PAD_ID), targets[:, :-1]], axis=1)
    inputs = jnp.where(inputs == EOS_ID, PAD_ID, inputs)
    last = (slots >= (length - last_len)[:, None]) & (slots < length[:, None])
    chex.assert_equal_shape((inputs, targets, last))
    return {"inputs": inputs, "targets": targets, "last": last}


def stream_sums(logits: jax.Array, targets: jax.Array, last: jax.Array) -> dict:
    """Additive sums over every real target (tokens and EOS: "window_*") and over the tokens of S(T)
    ("last_slice_*"); perplexity = exp(window_ce_sum / window_tokens)."""
    return target_ce_sums(logits, targets, last)


def last_state_mean_ce(logits: jax.Array, targets: jax.Array, last: jax.Array) -> jax.Array:
    """(B,) mean CE over each window's tokens of S(T) (Story Cloze scoring)."""
    return row_mean(optax.softmax_cross_entropy_with_integer_labels(logits, targets), last)


def greedy_last_state(logits_fn, inputs: jax.Array, n_tokens: int) -> jax.Array:
    """Greedy Ŝ(T) (B, N) after the context S(0..T-1) (B, T, N) (:func:`decode_last_state`)."""
    return decode_last_state(logits_fn, inputs, n_tokens)[0]


def decode_last_state(logits_fn, inputs: jax.Array, n_tokens: int, choose=decoding.greedy):
    """Ŝ(T) (B, N) after the context S(0..T-1) (B, T, N), and each token's probability (B, N): N full
    recomputations of ``logits_fn(stream) -> (B, S, V)``, each appending ``choose(logits, j)``
    (``rank4jax.models.decoding``); tokens after EOS become PAD."""
    batch = inputs.shape[0]
    window = jnp.concatenate([inputs, jnp.zeros((batch, 1, n_tokens), inputs.dtype)], axis=1)
    packed = pack_stream(window)
    stream = packed["inputs"]
    context_len = jnp.sum(stream != PAD_ID, axis=1)  # BOS + context tokens

    def body(j, carry):
        stream, out, probs = carry
        logits = logits_fn(stream)
        pos = context_len - 1 + j
        row = jnp.take_along_axis(logits, pos[:, None, None], axis=1)[:, 0]
        token = choose(row, j).astype(stream.dtype)
        write = pos + 1 < stream.shape[1]
        stream = jnp.where(
            (jnp.arange(stream.shape[1])[None] == (pos + 1)[:, None]) & write[:, None], token[:, None], stream
        )
        return stream, out.at[:, j].set(token), probs.at[:, j].set(decoding.chosen_probability(row, token))

    init = (stream, jnp.zeros((batch, n_tokens), inputs.dtype), jnp.zeros((batch, n_tokens), jnp.float32))
    _, tokens, probs = jax.lax.fori_loop(0, n_tokens, body, init)
    ended = jnp.cumsum(tokens == EOS_ID, axis=1) > 0
    return jnp.where(ended, PAD_ID, tokens), probs
