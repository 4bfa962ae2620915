"""Evaluation: window metrics over a split, Story Cloze accuracy, decoded predictions and
multi-step rollout (SPEC §4, §8).

Rollout: from the window S(0..T-1) the model predicts Ŝ(T); the window then drops its oldest state
and appends Ŝ(T), and so on — from the first prediction on, ground truth never enters the window.
Where the story has a gold sentence for a rollout step, its CE under the rolled-out context is
reported.
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from rank4jax.data.pipeline import eval_batches
from rank4jax.models.rank4.losses import means_from_sums


def _global_batch(rows: np.ndarray, sharding) -> jax.Array:
    """Every process holds the whole eval batch; each contributes its contiguous share of rows."""
    local = len(rows) // jax.process_count()
    start = jax.process_index() * local
    return jax.make_array_from_process_local_data(sharding, rows[start : start + local])


def evaluate_windows(eval_step, params, windows: np.ndarray, batch_size: int, batch_sharding) -> dict:
    """Exact means over every window (padding rows are all PAD and carry no tokens)."""
    totals: dict[str, float] = {}
    for batch in eval_batches({"windows": windows}, batch_size):
        sums = jax.device_get(eval_step(params, _global_batch(batch["windows"], batch_sharding)))
        for key, value in sums.items():
            totals[key] = totals.get(key, 0.0) + float(value)
    means = {k: float(v) for k, v in means_from_sums(totals).items()}
    return means | {
        "window_tokens": int(totals["window_tokens"]),
        "last_slice_tokens": int(totals["last_slice_tokens"]),
    }


def make_scorers(family, model_cfg):
    """Jitted (predict Ŝ(T) from inputs, mean CE of S(T) per window)."""
    predict = jax.jit(functools.partial(family.predict_last, cfg=model_cfg))
    score = jax.jit(functools.partial(family.last_slice_ce, cfg=model_cfg))
    return predict, score


def _batched(fn, params, array: np.ndarray, batch_size: int) -> np.ndarray:
    outs = []
    for batch in eval_batches({"x": array}, batch_size):
        outs.append(np.asarray(fn(params, batch["x"]))[batch["mask"]])
    return np.concatenate(outs) if outs else np.zeros((0,))


def cloze_accuracy(score, params, pairs: np.ndarray, labels: np.ndarray, batch_size: int) -> dict:
    """pairs (W, 2, T+1, N): the predicted ending is the candidate with the lower mean CE as S(T)."""
    if not len(pairs):
        return {}
    w = len(pairs)
    ce = _batched(score, params, pairs.reshape((2 * w,) + pairs.shape[2:]), batch_size).reshape(w, 2)
    predicted = np.argmin(ce, axis=1)
    return {"cloze_accuracy": float(np.mean(predicted == labels)), "cloze_stories": int(w)}


def rollout(predict, score, params, states: np.ndarray, n_slices: int, n_steps: int):
    """Roll out one story. states (S, N) gold states; returns predicted states (n_steps, N) and the
    CE of each gold sentence S(T+k) under the rolled-out window (None past the story's end)."""
    window = states[:n_slices].copy()
    predictions, ces = [], []
    for k in range(n_steps):
        gold_index = n_slices + k
        if gold_index < len(states):
            full = np.concatenate([window, states[gold_index][None]])[None]
            ces.append(float(np.asarray(score(params, full))[0]))
        else:
            ces.append(None)
        predicted = np.asarray(predict(params, window[None]))[0]
        predictions.append(predicted)
        window = np.concatenate([window[1:], predicted[None]])
    return np.stack(predictions), ces
