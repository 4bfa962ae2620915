"""Window losses and metrics (SPEC §4).

Axes: B batch, N tokens per state, T slices, V vocabulary, P = N·T positions (p = x·T + t), D the
flattened fiber. logits (B, N, T, V); targets (B, T, N) = S(1..T). PAD targets (id 0) are ignored
everywhere.

``row_loss_sums`` is the training path (``model.loss_sums`` calls it on the rows of any layout;
``readout_loss_sums`` is the same on full windows): it starts from the final-normed stream Y and the
readout factors, takes CE = logsumexp(logits) − target logit with the target logit computed from the
factors, and counts a token correct when its logit is the row maximum (argmax up to exact ties). No
gradient flows through an index into the logits (no scatter into a (B·P, V) zero tensor). Measured
side by side (``python -m bench.bench_readout``) it runs on par with autodiff through
``softmax_cross_entropy_with_integer_labels``; both take about twice the three matmuls' floor.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import optax

from rank4jax.models.losses import ce_sums, means_from_sums, row_mean
from rank4jax.models.rank4.codes import TOKEN_CODES
from rank4jax.tokens import PAD_ID


def token_cross_entropy(logits: jax.Array, targets: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per-token CE, correctness and non-PAD mask, each (B, N, T), of logits (B, N, T, V) and targets
    (B, T, N) = S(1..T), the order of the inputs (a ValueError names targets in another order)."""
    batch, n_tokens, n_slices, _ = logits.shape
    if tuple(targets.shape) != (batch, n_slices, n_tokens):
        order = (
            ": in the logits' order (B, N, T); swap axes 1 and 2"
            if targets.shape == (batch, n_tokens, n_slices)
            else ""
        )
        raise ValueError(
            f"targets must be (B, T, N) = {(batch, n_slices, n_tokens)}, S(1..T) as the inputs are given, for "
            f"logits (B, N, T, V) = {tuple(logits.shape)}; got {tuple(targets.shape)}{order}"
        )
    tgt = jnp.swapaxes(targets, 1, 2)  # (B, N, T) aligned with the logits
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, tgt)
    ce = jnp.where((tgt >= 0) & (tgt < logits.shape[-1]), ce, jnp.nan)  # an id outside [0, V): no loss, NaN
    correct = jnp.argmax(logits, axis=-1) == tgt
    return ce, correct, tgt != PAD_ID


def window_loss_sums(logits: jax.Array, targets: jax.Array) -> dict:
    """Additive sums and counts, so metrics can be aggregated exactly over many batches."""
    ce, correct, mask = token_cross_entropy(logits, targets)
    last = jnp.broadcast_to(jnp.arange(ce.shape[2]) == ce.shape[2] - 1, ce.shape)  # t = T-1
    return ce_sums(ce, correct, mask, last)


def readout_loss_sums(y: jax.Array, sem: jax.Array, tmp: jax.Array, targets: jax.Array) -> dict:
    """:func:`window_loss_sums` from Y (B, P, D) and the readout factors Esem (V, dx), W′ (V, dt)."""
    batch, n_slices, n_tokens = targets.shape
    tgt = jnp.swapaxes(targets, 1, 2).reshape(batch, n_tokens * n_slices)  # p = x·T + t, as Y
    last = jnp.broadcast_to(jnp.arange(n_tokens * n_slices) % n_slices == n_slices - 1, tgt.shape)
    return row_loss_sums(y, sem, tmp, tgt, last)


def row_loss_sums(y: jax.Array, sem: jax.Array, tmp: jax.Array, targets: jax.Array, last: jax.Array) -> dict:
    """The sums of :func:`window_loss_sums` over rows: Y (..., R, D), targets (..., R) (PAD: no
    loss) and ``last`` (..., R) bool, True for the rows of the last input slice; the paper's
    readout factors Esem (V, dx) and W′ (V, dt)."""
    params = {"embed": {"sem": sem}, "readout": {"tmp": tmp}}
    return code_loss_sums(params, y, targets, last, TOKEN_CODES["outer"])


def code_loss_sums(params: dict, y: jax.Array, targets: jax.Array, last: jax.Array, code) -> dict:
    """:func:`row_loss_sums` through a token code's readout (``rank4jax.models.rank4.codes``)."""
    chex.assert_equal_shape([targets, last])
    logits = code.logits(params, y)  # (..., R, V)
    ce = jax.nn.logsumexp(logits, axis=-1) - code.target_logits(params, y, targets)
    frozen = jax.lax.stop_gradient(logits)  # accuracy only: no gradient through the index
    correct = jnp.take_along_axis(frozen, targets[..., None], axis=-1)[..., 0] >= jnp.max(frozen, axis=-1)
    return ce_sums(ce, correct, targets != PAD_ID, last)


def window_losses(logits: jax.Array, targets: jax.Array) -> dict:
    """SPEC §11: mean CE over non-PAD targets of the window ("window_ce"), LS(T) over the last
    slice only ("last_slice_ce"), and token accuracy over non-PAD targets ("token_accuracy")."""
    return means_from_sums(window_loss_sums(logits, targets))


def last_slice_mean_ce(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Per-window mean CE over the non-PAD tokens of S(T): (B,). Used for Story Cloze scoring."""
    ce, _, mask = token_cross_entropy(logits, targets)
    return row_mean(ce[:, :, -1], mask[:, :, -1])
