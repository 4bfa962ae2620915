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
from rank4jax.engine.programs import CompiledStep

BATCHES = 4  # distinct batches per candidate (compact and trimmed shapes vary with the batch)
ROUNDS = 3  # timed passes over them, candidates interleaved; the median pass counts


def choose_layout(config, family, model_cfg, programs, train_windows: np.ndarray, groups: int, saved: dict | None):
    """(layout, figures, step): the run's batch layout; when it was measured now, the median seconds
    per step of each candidate (None when it was named, single, or kept from the checkpoints); and
    the layout's train step (``CompiledStep``: the run goes on with the executables timed here)."""
    candidates = candidate_layouts(config, family, model_cfg)
    kept = (saved or {}).get("batch_layout")
    if config.batch_layout != "auto" or len(candidates) == 1 or kept in candidates:
        # named, the rule, no choice, or a resumed run keeping what it chose
        name = kept if config.batch_layout == "auto" and kept in candidates else None
        layout = batch_layout(config, family, model_cfg, groups, name)
        return layout, None, train_step(programs, layout)
    layouts = {name: batch_layout(config, family, model_cfg, groups, name) for name in candidates}
    steps = {name: train_step(programs, layout) for name, layout in layouts.items()}
    seconds = time_layouts(layouts, steps, programs, train_windows, config.batch_size, config.seed)
    fastest = min(seconds, key=seconds.get)
    return layouts[fastest], seconds, steps[fastest]


def train_step(programs, layout) -> CompiledStep:
    """The run's train step for ``layout``: compiled once per batch shape, at most as many as it makes."""
    body, k = programs.microbatch_step, programs.policy.grad_accum_steps
    repeated = None if body is None else (k, body)  # XLA counts the accumulation's scan body once
    name = f"train step ({layout.name} batches)"
    return CompiledStep(programs.train_step, max_shapes=layout.max_shapes, name=name, repeated=repeated)


def time_layouts(layouts: dict, steps: dict, programs, windows: np.ndarray, batch_size: int, seed: int) -> dict:
    """Median seconds per train step (``steps[name]``) of each layout over ``BATCHES`` batches drawn
    from ``windows``."""
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
                state, metrics = steps[name](state, batch)
            jax.block_until_ready(metrics)
            if round_:
                passes[name].append((time.perf_counter() - start) / len(batches))
    return {name: statistics.median(times) for name, times in passes.items()}
