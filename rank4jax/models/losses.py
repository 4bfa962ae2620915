"""The loss schema every model family returns, and its helpers: additive sums, so metrics aggregate
exactly over batches and devices.

    window_ce_sum, window_tokens           CE over the family's selection-loss targets (family.selection_loss)
    last_slice_ce_sum, last_slice_tokens   CE over the content tokens of S(T): LS(T), comparable across families
    correct_tokens                         argmax hits over the selection-loss targets
    objective                              the training loss (formed in one place: :func:`with_objective`)

``means_from_sums`` turns summed (or per-batch) sums into window_ce, last_slice_ce and token_accuracy.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from rank4jax.tokens import PAD_ID


def ce_sums(ce: jax.Array, correct: jax.Array, mask: jax.Array, last: jax.Array) -> dict:
    """The schema's sums from per-target CE, correctness, the selection mask and the LS(T) mask
    (``last``, counted where ``mask`` holds too); all four arrays have the same shape."""
    mask_f = mask.astype(ce.dtype)
    last_f = last.astype(ce.dtype) * mask_f
    return {
        "window_ce_sum": jnp.sum(ce * mask_f),
        "window_tokens": jnp.sum(mask_f),
        "last_slice_ce_sum": jnp.sum(ce * last_f),
        "last_slice_tokens": jnp.sum(last_f),
        "correct_tokens": jnp.sum(correct.astype(ce.dtype) * mask_f),
    }


OBJECTIVE_OVER = ("window", "last_slice")  # the sums a training objective can average


def with_objective(sums: dict, aux=0.0, aux_weight: float = 1.0, over: str = "window") -> dict:
    """The sums and the training objective: the mean CE over the ``over`` targets ("window": the
    family's selection-loss targets; "last_slice": the content tokens of S(T)), plus ``aux_weight``
    times a family's auxiliary term (a score variant's regulariser, the SPLM's potential penalty)."""
    objective = sums[f"{over}_ce_sum"] / jnp.maximum(sums[f"{over}_tokens"], 1)
    return sums | {"objective": objective + aux_weight * aux}


def target_ce_sums(logits: jax.Array, targets: jax.Array, last: jax.Array) -> dict:
    """:func:`ce_sums` over a sequence of targets (B, J) with logits (B, J, V): every non-PAD target
    is selected; ``last`` marks the LS(T) targets."""
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    return ce_sums(ce, jnp.argmax(logits, axis=-1) == targets, targets != PAD_ID, last)


def row_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
    """(B, J) values and mask → (B,) mean over each row's masked entries (0 for a row with none)."""
    mask = mask.astype(values.dtype)
    return jnp.sum(values * mask, axis=1) / jnp.maximum(jnp.sum(mask, axis=1), 1)


def means_from_sums(sums: dict) -> dict:
    """window_ce, last_slice_ce, token_accuracy from :func:`window_loss_sums` (0 where no token)."""

    def ratio(num, den):
        return num / jnp.maximum(den, 1)

    return {
        "window_ce": ratio(sums["window_ce_sum"], sums["window_tokens"]),
        "last_slice_ce": ratio(sums["last_slice_ce_sum"], sums["last_slice_tokens"]),
        "token_accuracy": ratio(sums["correct_tokens"], sums["window_tokens"]),
    }
