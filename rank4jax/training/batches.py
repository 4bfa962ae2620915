"""What a jitted train or eval step consumes: full-width windows, windows trimmed to their used
width, or a compact batch (only the positions that can reach the loss).

The choice is made once per run from the config and the model family (``compact_buckets``,
``trim_padding_multiple``) and applies to training and evaluation alike: both layouts give exactly
the full-width loss sums, so evaluation skips the same PAD work as training (the readout runs only
on the rows that carry a target). Each process would cut its rows to its own shape, so only a
single-process run trims or compacts.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import ml_collections
import numpy as np

from rank4jax.data.compact import compact_windows
from rank4jax.data.windows import trim_padding
from rank4jax.models.family import ModelFamily


def batch_layout(
    config: ml_collections.ConfigDict, family: ModelFamily, model_cfg, groups: int
) -> Callable[[np.ndarray], np.ndarray | dict]:
    """windows (B, T+1, N) numpy → the step's input. ``groups``: devices along the data axis (a
    compact batch keeps each device's windows in a group of its own)."""
    single = jax.process_count() == 1
    accepted = family.layouts(model_cfg) if single else ()
    compact = config.get("compact_buckets", 0) if "compact" in accepted else 0
    trim = config.get("trim_padding_multiple", 0) if "trimmed" in accepted and not compact else 0

    def layout(windows: np.ndarray):
        if compact:
            return compact_windows(windows, groups=groups, buckets=compact)
        if trim:
            return trim_padding(windows, trim)
        return windows

    layout.name = "compact" if compact else "trimmed" if trim else "full"
    # the most distinct batch shapes the layout can produce (a jitted step compiles once for each):
    # compact rows R and target rows R_t ≤ R are each one of ``compact`` bucket sizes; a trimmed
    # width is a multiple of ``trim`` up to N, or N
    n_tokens = model_cfg.n_tokens
    layout.max_shapes = compact * (compact + 1) // 2 if compact else -(-n_tokens // trim) if trim else 1
    return layout
