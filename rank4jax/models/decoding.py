"""How a decoding family picks each next token: ``choose(logits (B, V), j) -> (B,) int32`` for the
j-th token of the predicted state. The decoders (the baseline's cached free-running decode, the
stream families' greedy loop) receive it; greedy argmax is the default and the reported protocol."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def greedy(logits: jax.Array, j) -> jax.Array:
    del j
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)


def sampler(key: jax.Array, temperature: float, top_k: int = 0):
    """Sampling from softmax(logits / temperature), from the ``top_k`` most likely tokens only when
    ``top_k`` > 0; token j draws with ``fold_in(key, j)``. ``temperature`` 0 is greedy, and so is one
    below float32's smallest normal number (XLA flushes such a divisor to zero: the logits would be NaN)."""
    if temperature < np.finfo(np.float32).tiny:
        return greedy

    def choose(logits: jax.Array, j) -> jax.Array:
        wide = logits.astype(jnp.float32)
        scaled = (wide - jnp.max(wide, axis=-1, keepdims=True)) / temperature  # the best at 0: any tiny T is finite
        if top_k:
            kth = jax.lax.top_k(scaled, top_k)[0][..., -1:]
            scaled = jnp.where(scaled >= kth, scaled, -jnp.inf)
        return jax.random.categorical(jax.random.fold_in(key, j), scaled, axis=-1).astype(jnp.int32)

    return choose


def chosen_probability(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    """The model's own (untempered) probability of each chosen token: logits (..., V), tokens (...)."""
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    return jnp.take_along_axis(probs, tokens[..., None].astype(jnp.int32), axis=-1)[..., 0]
