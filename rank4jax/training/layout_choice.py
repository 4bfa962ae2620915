"""The batch layout chosen by measurement (``batch_layout="auto"``), as cuDNN's benchmark mode
chooses a convolution algorithm: each candidate layout's train step is compiled and timed on the
same few batches of the run's own training windows, interleaved, on a throwaway train state, before
the run's state exists; the fastest is kept, logged with its figures and saved with the run's
checkpoints, so a resume (and its evaluation) keeps it without measuring again. Every layout gives
exactly the same losses and gradients, so the choice changes speed only.
"""

from __future__ import annotations

import statistics
import time

import jax
import numpy as np

from rank4jax.engine import sharding
from rank4jax.engine.batches import batch_layout, candidate_layouts

BATCHES = 4  # distinct batches per candidate (compact and trimmed shapes vary with the batch)
ROUNDS = 3  # timed passes over them, candidates interleaved; the median pass counts


def choose_layout(config, family, model_cfg, programs, train_windows: np.ndarray, groups: int, saved: dict | None):
    """(layout, figures): the run's batch layout and, when it was measured now, the median seconds
    per step of each candidate (None when it was named, single, or kept from the checkpoints)."""
    candidates = candidate_layouts(config, family, model_cfg)
    kept = (saved or {}).get("batch_layout")
    if config.batch_layout != "auto" or len(candidates) == 1:  # named, the rule, or no choice
        return batch_layout(config, family, model_cfg, groups), None
    if kept in candidates:  # a resumed run keeps what it chose
        return batch_layout(config, family, model_cfg, groups, kept), None
    layouts = {name: batch_layout(config, family, model_cfg, groups, name) for name in candidates}
    seconds = time_layouts(layouts, programs, train_windows, config.batch_size, config.seed)
    return layouts[min(seconds, key=seconds.get)], seconds


def time_layouts(layouts: dict, programs, windows: np.ndarray, batch_size: int, seed: int) -> dict[str, float]:
    """Median seconds per train step of each layout over ``BATCHES`` batches drawn from ``windows``."""
    rng = np.random.default_rng(seed)
    picks = [rng.choice(len(windows), size=batch_size, replace=len(windows) < batch_size) for _ in range(BATCHES)]
    inputs = {
        name: [sharding.put_batch(layout(windows[p]), programs.batch_sharding) for p in picks]
        for name, layout in layouts.items()
    }
    state = programs.init(jax.random.key(seed))  # throwaway: donated from step to step
    passes = {name: [] for name in layouts}
    for round_ in range(ROUNDS + 1):  # the first pass compiles each shape and is not counted
        for name, batches in inputs.items():
            start = time.perf_counter()
            for batch in batches:
                state, metrics = programs.train_step(state, batch)
            jax.block_until_ready(metrics)
            if round_:
                passes[name].append((time.perf_counter() - start) / len(batches))
    return {name: statistics.median(times) for name, times in passes.items()}
