"""Window losses and metrics (SPEC §4).

Axes: B batch, N tokens per state, T slices, V vocabulary. logits (B, N, T, V); targets
(B, T, N) = S(1..T). PAD targets (id 0) are ignored everywhere.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import optax

from rank4jax.models.common import PAD_ID


def token_cross_entropy(logits: jax.Array, targets: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per-token CE, correctness and non-PAD mask, each (B, N, T)."""
    batch, n_tokens, n_slices, _ = logits.shape
    chex.assert_shape(targets, (batch, n_slices, n_tokens))
    tgt = jnp.swapaxes(targets, 1, 2)  # (B, N, T) aligned with the logits
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, tgt)
    correct = jnp.argmax(logits, axis=-1) == tgt
    return ce, correct, tgt != PAD_ID


def window_loss_sums(logits: jax.Array, targets: jax.Array) -> dict:
    """Additive sums and counts, so metrics can be aggregated exactly over many batches."""
    ce, correct, mask = token_cross_entropy(logits, targets)
    mask_f = mask.astype(ce.dtype)
    last = mask_f[:, :, -1]
    return {
        "window_ce_sum": jnp.sum(ce * mask_f),
        "window_tokens": jnp.sum(mask_f),
        "last_slice_ce_sum": jnp.sum(ce[:, :, -1] * last),
        "last_slice_tokens": jnp.sum(last),
        "correct_tokens": jnp.sum(correct.astype(ce.dtype) * mask_f),
    }


def means_from_sums(sums: dict) -> dict:
    """window_ce, last_slice_ce, token_accuracy from :func:`window_loss_sums` (0 where no token)."""

    def ratio(num, den):
        return num / jnp.maximum(den, 1)

    return {
        "window_ce": ratio(sums["window_ce_sum"], sums["window_tokens"]),
        "last_slice_ce": ratio(sums["last_slice_ce_sum"], sums["last_slice_tokens"]),
        "token_accuracy": ratio(sums["correct_tokens"], sums["window_tokens"]),
    }


def window_losses(logits: jax.Array, targets: jax.Array) -> dict:
    """SPEC §11: mean CE over non-PAD targets of the window ("window_ce"), LS(T) over the last
    slice only ("last_slice_ce"), and token accuracy over non-PAD targets ("token_accuracy")."""
    return means_from_sums(window_loss_sums(logits, targets))


def last_slice_mean_ce(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Per-window mean CE over the non-PAD tokens of S(T): (B,). Used for Story Cloze scoring."""
    ce, _, mask = token_cross_entropy(logits, targets)
    mask_f = mask[:, :, -1].astype(ce.dtype)
    return jnp.sum(ce[:, :, -1] * mask_f, axis=1) / jnp.maximum(jnp.sum(mask_f, axis=1), 1)
