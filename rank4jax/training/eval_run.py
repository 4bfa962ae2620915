"""Evaluate a saved run from its workdir alone (config and tokenizer come from the checkpoint).

Reports on a chosen split: window loss, LS(T) and token accuracy; Story Cloze accuracy when the
stories carry two candidate endings; a few decoded predictions Ŝ(T) beside the gold sentence; and
multi-step rollout CE where the stories are long enough. Writes ``eval/<split>_step<N>.json``.
"""

from __future__ import annotations

import json
import os
import re

import jax
import numpy as np

from rank4jax.data.windows import SPLITS, cloze_windows, encode_story
from rank4jax.errors import ConfigError
from rank4jax.training import sharding
from rank4jax.training.checkpointing import RunCheckpoints, describe_run, with_shardings
from rank4jax.training.data_setup import prepare_data
from rank4jax.training.evaluation import cloze_accuracy, evaluate_windows, make_scorers, rollout
from rank4jax.training.steps import jit_eval_step

_SENTENCE_FINAL = re.compile(r"[.!?]")


def display_text(tokenizer, ids) -> str:
    """Decode a predicted state for display, cut after its first sentence-final token: PAD targets
    are never trained, so positions after a sentence's end hold arbitrary predictions."""
    text = tokenizer.decode(ids)
    end = _SENTENCE_FINAL.search(text)
    return text[: end.end()] if end else text


def evaluate_run(
    workdir: str,
    split: str = "test",
    step: str | int = "best",
    data_path: str | None = None,
    num_examples: int = 5,
    rollout_steps: int = 3,
) -> dict:
    if split not in SPLITS:
        raise ConfigError(f"split must be one of {SPLITS}, got {split!r}")
    with RunCheckpoints(workdir, read_only=True) as ckpt:
        run = describe_run(ckpt, step)
        step, config, tokenizer, family, model_cfg = run.step, run.config, run.tokenizer, run.family, run.model_cfg
        data = prepare_data(config, tokenizer, path=data_path)
        # data parallel over as many devices as divide the eval batch (independent of the training mesh)
        n_data = max(d for d in range(1, jax.device_count() + 1) if config.eval_batch_size % d == 0)
        mesh = sharding.make_mesh(n_data, 1)
        replicated, batch_sharding = sharding.replicated(mesh), sharding.batch_sharding(mesh)
        state_sharding = sharding.state_shardings(mesh, run.abstract_state)
        state = ckpt.restore_state(step, with_shardings(run.abstract_state, state_sharding))
    params = state.params
    windows = data.windows[split].windows
    stories = data.stories[split]
    report = {
        "workdir": os.path.abspath(workdir),
        "step": step,
        "split": split,
        "data": data.source,
        "stories": len(stories),
        "windows": int(len(windows)),
        "skipped_stories": data.windows[split].n_skipped,
    }
    if not len(windows):
        report["note"] = "no windows in this split"
        return _write(workdir, report)

    eval_step = jit_eval_step(family, model_cfg, state_sharding.params, batch_sharding, replicated)
    report |= evaluate_windows(eval_step, params, windows, config.eval_batch_size, batch_sharding)
    predict, score = make_scorers(family, model_cfg)
    pairs, labels = cloze_windows(stories, tokenizer, model_cfg.n_tokens, model_cfg.n_slices)
    report |= cloze_accuracy(score, params, pairs, labels, config.eval_batch_size)

    t = model_cfg.n_slices
    examples = []
    for i in range(min(num_examples, len(windows))):
        window = windows[i]
        predicted = np.asarray(predict(params, window[None, :t]))[0]
        examples.append(
            {
                "context": [tokenizer.decode(s) for s in window[:t]],
                "gold": tokenizer.decode(window[t]),
                "predicted": display_text(tokenizer, predicted),
            }
        )
    report["examples"] = examples

    per_step: list[list[float]] = [[] for _ in range(rollout_steps)]
    rollouts = []
    for story in stories:
        if len(story.sentences) < t:
            continue
        states = encode_story(tokenizer, story.sentences, model_cfg.n_tokens)
        predicted, ces = rollout(predict, score, params, states, t, rollout_steps)
        for k, ce in enumerate(ces):
            if ce is not None:
                per_step[k].append(ce)
        if len(rollouts) < num_examples:
            rollouts.append(
                {"context": list(story.sentences[:t]), "rollout": [display_text(tokenizer, p) for p in predicted]}
            )
    report["rollout_mean_ce"] = [float(np.mean(v)) if v else None for v in per_step]
    report["rollout_stories"] = [len(v) for v in per_step]
    report["rollout_examples"] = rollouts
    return _write(workdir, report)


def _write(workdir: str, report: dict) -> dict:
    out_dir = os.path.join(workdir, "eval")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{report['split']}_step{report['step']}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    report["path"] = path
    return report
