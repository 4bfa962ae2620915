"""What a jitted train or eval step consumes: full-width windows, windows trimmed to their used
width, or a compact batch (only the positions that can reach the loss).

The layout is one per run and applies to training and evaluation alike: every layout gives exactly
the full-width loss sums, so evaluation skips the same PAD work as training (the readout runs only
on the rows that carry a target). ``batch_layout`` in the config names it, or is ``"rule"``: the
first of the candidates the config enables (compact with ``compact_buckets``, trimmed with
``trim_padding_multiple``, full width always), or ``"auto"``: the candidates are timed at the start
of the run and the fastest kept (``training.layout_choice``). A run's checkpoints carry the layout it
used, so a resume and its evaluation keep it. Each process would cut its rows to its own shape, so
only a single-process run trims or compacts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from rank4jax.data.compact import compact_windows
from rank4jax.data.windows import trim_padding
from rank4jax.errors import ConfigError
from rank4jax.models.family import ModelFamily

LAYOUTS = ("compact", "trimmed", "full")  # in the rule's order: it takes the first enabled one
SETTINGS = ("auto", "rule", *LAYOUTS)  # the config's batch_layout


def candidate_layouts(config: ml_collections.ConfigDict, family: ModelFamily, model_cfg) -> list[str]:
    """The layouts this run may use, in the rule's order: compact and trimmed where the family
    accepts them, the config enables them and the run is a single process; full width always."""
    accepted = family.layouts(model_cfg) if jax.process_count() == 1 else ()
    enabled = {"compact": config.compact_buckets, "trimmed": config.trim_padding_multiple}
    return [name for name in LAYOUTS if name == "full" or (name in accepted and enabled[name])]


def batch_layout(
    config: ml_collections.ConfigDict, family: ModelFamily, model_cfg, groups: int, name: str | None = None
) -> Callable[[np.ndarray], np.ndarray | dict]:
    """windows (B, T+1, N) numpy → the step's input, in layout ``name`` (default: the config's
    ``batch_layout`` when it names one of the candidates, else the rule's, the first candidate).
    ``groups``: devices along the data axis (a compact batch keeps each device's windows in a group
    of its own)."""
    candidates = candidate_layouts(config, family, model_cfg)
    name = name or config.batch_layout
    if name in ("auto", "rule"):  # not measured (yet): the rule's
        name = candidates[0]
    if name not in candidates:
        raise ConfigError(f"batch_layout {name!r} is not available to this run (it may use {', '.join(candidates)})")
    compact = config.compact_buckets if name == "compact" else 0
    trim = config.trim_padding_multiple if name == "trimmed" else 0

    def layout(windows: np.ndarray):
        if compact:
            return compact_windows(windows, groups=groups, buckets=compact)
        if trim:
            return trim_padding(windows, trim)
        return windows

    layout.name = name
    # the most distinct batch shapes the layout can produce (a jitted step compiles once for each):
    # compact rows R and target rows R_t ≤ R are each one of ``compact`` bucket sizes; a trimmed
    # width is a multiple of ``trim`` up to N, or N
    n_tokens = model_cfg.n_tokens
    layout.max_shapes = compact * (compact + 1) // 2 if compact else -(-n_tokens // trim) if trim else 1
    return layout


def n_windows(batch) -> int:
    """The windows of a step's batch: B of full or trimmed windows, G·W of a compact batch."""
    if isinstance(batch, Mapping):
        return batch["grid"].shape[0] * batch["grid"].shape[1]
    return batch.shape[0]


def microbatches(tree, k: int, groups: int):
    """Split a batch (and anything aligned with its leading axis) into ``k`` microbatches, stacked on
    a new leading axis: every leaf (L, ...) → (k, L/k, ...). The leading axis is sharded over
    ``groups`` devices; microbatch j takes the j-th k-th of each device's part, so no row changes
    device."""

    def split(x):
        parts = jnp.swapaxes(x.reshape((groups, k, -1) + x.shape[1:]), 0, 1)  # (k, groups, L/(groups·k), ...)
        return parts.reshape((k, -1) + x.shape[1:])

    return jax.tree.map(split, tree)
