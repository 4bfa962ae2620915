"""Shared helpers for benchmarks: synthetic windows, jitted train steps, interleaved timing and
compiled-memory figures. Benchmarks report ratios measured side by side in one run."""

from __future__ import annotations

import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from rank4jax.engine import sharding
from rank4jax.engine.programs import StepPolicy, build_programs, optim_key
from rank4jax.models.family import RANK4


def synthetic_windows(batch: int, n_slices: int, n_tokens: int, vocab: int, pad_tail: int = 3, seed: int = 0):
    """Random (B, T+1, N) windows whose last ``pad_tail`` positions are PAD (as the PyTorch peer)."""
    rng = np.random.default_rng(seed)
    windows = rng.integers(4, vocab, size=(batch, n_slices + 1, n_tokens), dtype=np.int32)
    if pad_tail:
        windows[:, :, n_tokens - pad_tail :] = 0
    return windows


def real_windows(batch: int, n_tokens: int, n_slices: int, vocab: int, seed: int = 0) -> tuple[np.ndarray, str]:
    """``batch`` training windows of real sentences at N, T: Story Cloze (``configs/storycloze.py``'s
    data) when ``../shared/data`` is present, else the built-in corpus. Ids ≥ ``vocab`` become UNK."""
    from configs import default, storycloze
    from rank4jax.engine.data_setup import prepare_data
    from rank4jax.tokens import UNK_ID

    config = storycloze.get_config()
    if not os.path.isfile(config.data.path):
        config = default.get_config()
    config.model.n_tokens, config.model.n_slices = n_tokens, n_slices
    data = prepare_data(config)
    windows = data.windows["train"].windows
    chosen = windows[np.random.default_rng(seed).choice(len(windows), batch, replace=False)]
    return np.where(chosen >= vocab, UNK_ID, chosen).astype(np.int32), data.source


def compiled_train_step(
    model_cfg, windows, learning_rate: float = 3e-4, weight_decay: float = 0.01, compute_dtype="float32", family=RANK4
):
    """(the run's train step compiled ahead of time for ``windows`` on one device, initial state,
    compile seconds, compiled memory analysis). ``compute_dtype``: the run's precision policy
    (``config.compute_dtype``: float32 parameters, bfloat16 matmuls and activations)."""
    from configs import default

    optim = default.get_config().optim
    optim.learning_rate, optim.weight_decay, optim.warmup_steps = learning_rate, weight_decay, 0
    policy = StepPolicy(compute_dtype=jnp.dtype(compute_dtype).name)
    programs = build_programs(family, model_cfg, optim_key(optim), sharding.make_mesh(1, 1), policy)
    state = programs.init(jax.random.key(0))
    t0 = time.perf_counter()
    compiled = programs.train_step.lower(state, windows).compile()
    compile_s = time.perf_counter() - t0
    return compiled, state, compile_s, compiled.memory_analysis()


def peak_bytes(memory) -> int:
    """Arguments + outputs + XLA temporaries of a compiled program (its peak device footprint)."""
    return int(memory.argument_size_in_bytes + memory.output_size_in_bytes + memory.temp_size_in_bytes)


def run_steps(compiled, state, windows, steps: int):
    """Run ``steps`` steps; returns (seconds, new state). Blocks on the result."""
    t0 = time.perf_counter()
    metrics = None
    for _ in range(steps):
        state, metrics = compiled(state, windows)
    jax.block_until_ready(metrics)
    return time.perf_counter() - t0, state


def step_timer(run: dict, steps: int):
    """A callable timing ``steps`` steps of ``run["step"]`` on ``run["batch"]`` (seconds per step); it
    keeps the donated state in ``run["state"]``."""

    def time_steps() -> float:
        seconds, run["state"] = run_steps(run["step"], run["state"], run["batch"], steps)
        return seconds / steps

    return time_steps


def interleaved_medians(runners: dict, repeats: int) -> dict:
    """Call each runner (returning seconds) in turn, ``repeats`` rounds; median seconds per name."""
    times = {name: [] for name in runners}
    for _ in range(repeats):
        for name, runner in runners.items():
            times[name].append(runner())
    return {name: statistics.median(values) for name, values in times.items()}
