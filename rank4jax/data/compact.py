"""Compact batches: only the window positions that can reach the loss (host side, numpy).

Axes: B windows, T input slices, N tokens per state, P = N·T positions (x, t) of a window, p = x·T + t,
G groups (one per data shard; the leading axis of every array, split across devices), W = B/G
windows per group, R rows per group, R_t ≤ R rows with a target.

A position (x, t) of a window matters when its input token S(t)[x] is not PAD (it is a key of every
query of the window) or its target S(t+1)[x] is not PAD (its logits enter the loss). Every other
position is a masked key with a PAD target: nothing computed there reaches the loss, so a compact
batch leaves it out. Real sentences leave many such positions (about 30% of a Story Cloze window at
N = 16), while cutting only the columns that are PAD in every window of a batch saves little,
because one long sentence keeps a column.

The rows of a group are its windows' positions that matter, those with a target first (rows
[0, R_t) carry every target, so the readout runs on R_t rows only), then the key-only ones, then
filler rows (PAD input, PAD target). Arrays (int32):

    tokens   (G, R)     input token of each row (PAD for filler)
    position (G, R)     x, the token position of the row (for the position tables)
    slice    (G, R)     t, the input slice of the row
    targets  (G, R_t)   target token of the first R_t rows (PAD: no loss)
    grid     (G, W, P)  row of each window's position p; R where the position was left out
    slot     (G, R)     the row's index w·P + p in the flattened (W·P) grid; W·P for filler rows

``grid`` and ``slot`` are inverse maps (each row sits in at most one slot), so moving a (G, R, ·)
tensor to the grid and back are both plain gathers, in the forward and the backward pass.
A window without any input token keeps all P positions (its queries then attend uniformly to its
PAD keys, exactly as at full width).

R and R_t are rounded up to a multiple of ⌈W·P / buckets⌉, so a jitted step sees only a few distinct
shapes (2–3 over a Story Cloze or built-in-corpus run with the default 8 buckets).
"""

from __future__ import annotations

import numpy as np

from rank4jax.tokens import PAD_ID


def _round_up(value: int, multiple: int) -> int:
    return max(multiple, -(-value // multiple) * multiple)


def _group_positions(inputs: np.ndarray, targets: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """inputs, targets (B, P) token ids → per window: the flat positions p that have a target, and
    those that are keys only."""
    with_target, key_only = [], []
    for has_input, has_target in zip(inputs != PAD_ID, targets != PAD_ID, strict=True):
        if not has_input.any():  # no key at all: keep the window whole
            has_input = np.ones_like(has_input)
        with_target.append(np.flatnonzero(has_target))
        key_only.append(np.flatnonzero(has_input & ~has_target))
    return with_target, key_only


def compact_windows(windows: np.ndarray, groups: int = 1, buckets: int = 8) -> dict[str, np.ndarray]:
    """windows (B, T+1, N) int → a compact batch (see the module docstring), B divisible by ``groups``."""
    batch, n_states, n_tokens = windows.shape
    n_slices = n_states - 1
    if groups < 1 or batch % groups:
        raise ValueError(f"batch {batch} is not divisible into {groups} groups")
    if buckets < 1:
        raise ValueError(f"buckets must be at least 1, got {buckets}")
    per_group, positions = batch // groups, n_tokens * n_slices
    inputs = np.swapaxes(windows[:, :-1], 1, 2).reshape(batch, -1)  # (B, P), p = x·T + t
    targets = np.swapaxes(windows[:, 1:], 1, 2).reshape(batch, -1)
    with_target, key_only = _group_positions(inputs, targets)

    row_multiple = -(-per_group * positions // buckets)
    members = [range(g * per_group, (g + 1) * per_group) for g in range(groups)]
    n_rows = max(sum(len(with_target[b]) + len(key_only[b]) for b in m) for m in members)
    n_target_rows = max(sum(len(with_target[b]) for b in m) for m in members)
    n_rows = _round_up(n_rows, row_multiple)
    n_target_rows = min(_round_up(n_target_rows, row_multiple), n_rows)

    out = {
        "tokens": np.full((groups, n_rows), PAD_ID, np.int32),
        "position": np.zeros((groups, n_rows), np.int32),
        "slice": np.zeros((groups, n_rows), np.int32),
        "targets": np.full((groups, n_target_rows), PAD_ID, np.int32),
        "grid": np.full((groups, per_group, positions), n_rows, np.int32),
        "slot": np.full((groups, n_rows), per_group * positions, np.int32),
    }
    for g, member in enumerate(members):
        # window-local index and flat position of every row: targets first, then keys only
        order = [(w, p) for part in (with_target, key_only) for w, b in enumerate(member) for p in part[b]]
        local = np.fromiter((w for w, _ in order), np.int64, len(order))
        flat = np.fromiter((p for _, p in order), np.int64, len(order))
        source = local + g * per_group
        rows = np.arange(len(order))
        out["tokens"][g, rows] = inputs[source, flat]
        out["position"][g, rows] = flat // n_slices
        out["slice"][g, rows] = flat % n_slices
        n_with_target = sum(len(with_target[b]) for b in member)
        out["targets"][g, :n_with_target] = targets[source[:n_with_target], flat[:n_with_target]]
        out["grid"][g, local, flat] = rows
        out["slot"][g, rows] = local * positions + flat
    return out


def compact_size(batch: dict[str, np.ndarray]) -> tuple[int, int]:
    """(R, R_t) of a compact batch: the shapes a jitted step is specialised on."""
    return batch["tokens"].shape[1], batch["targets"].shape[1]
