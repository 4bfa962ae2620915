"""Analytic model FLOPs of one window's forward pass: 2 × the multiply-adds of its matmuls and
attention contractions, counted at full width (a trimmed or compact batch skips work, so its
achieved rate shows above the arithmetic it does). Softmax, LayerNorm and other elementwise work
are not counted, as in PaLM's MFU; nor are ZPX score terms. A train step counts 3 × the forward
(the backward ≈ 2 ×). The benches and the training log (FLOP/s per device, MFU) share these counts.

Axes: N tokens per state, T slices, P = N·T, D width, H heads, L layers, V vocabulary; for the 1-D
baseline S = 1 + (T+1)·N cache slots (the context Lc = 1 + T·N, then S(T)'s N tokens).
"""

from __future__ import annotations

TRAIN_FACTOR = 3  # forward + backward


def _projections_and_mlp(tokens: int, width: int, maps: int) -> int:
    """``maps`` D×D maps (Q, K, V [, O]) and the D→4D→D MLP at ``tokens`` positions."""
    return 2 * maps * tokens * width * width + 2 * 2 * tokens * width * 4 * width


def rank4_forward(cfg) -> int:
    """The rank-4 model: per head full-fiber Q/K/V maps, scores and weighted sum over the P × P joint
    grid; the tied readout at all P positions."""
    p, d, h = cfg.n_tokens * cfg.n_slices, cfg.width, cfg.n_heads
    per_layer = 2 * 3 * h * p * d * d + 2 * 2 * h * p * p * d + 2 * 2 * p * d * 4 * d
    return cfg.n_layers * per_layer + 2 * p * d * cfg.vocab_size


def _causal_1d(cfg, queries: int, read: int) -> int:
    """The 1-D transformer: ``queries`` token positions, each attending over every cache slot, and the
    tied readout at ``read`` of them."""
    d, slots = cfg.width, cfg.context_slots + cfg.n_tokens
    per_layer = _projections_and_mlp(queries, d, 4) + 2 * 2 * queries * slots * d
    return cfg.n_layers * per_layer + 2 * read * d * cfg.vocab_size


def baseline_forward(cfg) -> int:
    """The free-running baseline: the context prefilled, then N decode steps; the readout at the
    N + 1 targets (S(T) and EOS)."""
    return _causal_1d(cfg, cfg.context_slots + cfg.n_tokens, cfg.target_slots)


def stream_forward(cfg) -> int:
    """The baseline as a token LM over the stream: every slot is a query and is read out."""
    slots = cfg.context_slots + cfg.n_tokens
    return _causal_1d(cfg, slots, slots)


def train_flops_per_window(family, cfg) -> int | None:
    """FLOPs of a train step per window, or None for a family without a count (the SPLM)."""
    forward = family.forward_flops
    return None if forward is None else TRAIN_FACTOR * forward(cfg)
