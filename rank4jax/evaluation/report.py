"""Evaluate a saved run from its workdir alone (config and tokenizer come from the checkpoint).

Reports on a chosen split (``train``, ``validation``, ``test``, or ``all``: every story of the
file, for external test sets): window loss, LS(T) and token accuracy; Story Cloze accuracy by the three
scoring rules (``rank4jax.evaluation.evaluators``) when the stories carry two candidate endings; a few
decoded predictions Ŝ(T) beside the gold sentence; and multi-step rollout CE where the stories are
long enough. Every part runs batched. Writes ``eval/<split>_step<N>.json`` (with ``--data=FILE``:
``eval/<file name>-<path hash>.<split>_step<N>.json``, so no report overwrites another: not the run's
own, nor another file's of the same name).
"""

from __future__ import annotations

import functools
import hashlib
import math
import numbers
import os
import re
import time

import jax
import numpy as np

from rank4jax import files
from rank4jax.checkpoint.storage import RunCheckpoints
from rank4jax.data.windows import SPLITS, cloze_windows, encode_story
from rank4jax.engine import sharding
from rank4jax.engine.batches import batch_layout
from rank4jax.engine.data_setup import check_held_out, prepare_split
from rank4jax.engine.programs import StepPolicy, build_programs, optim_key
from rank4jax.engine.run_config import data_fingerprint
from rank4jax.errors import ConfigError, DataError, WorkdirError, say
from rank4jax.evaluation.evaluators import CLOZE_CONTEXTS, Evaluators
from rank4jax.models.family import objective_label
from rank4jax.models.precision import check_compute_dtype
from rank4jax.records import check_own_paths
from rank4jax.runs import restore_run
from rank4jax.tokens import PAD_ID

EVAL_SPLITS = SPLITS + ("all",)
_SENTENCE_FINAL = re.compile(r"[.!?]")


def display_text(tokenizer, ids) -> str:
    """Decode a predicted state for display, cut after its first sentence-final token: PAD targets
    are never trained, so positions after a sentence's end hold arbitrary predictions."""
    text = tokenizer.decode(ids)
    end = _SENTENCE_FINAL.search(text)
    return text[: end.end()] if end else text


def check_count(name: str, value) -> None:
    """A ConfigError unless ``value`` is a non-negative integer (an evaluation option's count)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ConfigError(f"{name} must be a non-negative integer (0 = skip), got {value!r}")


def evaluate_run(
    workdir: str,
    split: str = "test",
    step: str | int = "best",
    data_path: str | None = None,
    num_examples: int = 5,
    rollout_steps: int = 1,
    cloze_contexts: int = CLOZE_CONTEXTS,
    compute_dtype: str | None = None,
) -> dict:
    """Evaluate checkpoint ``step`` of the run in ``workdir`` on ``split`` (of ``data_path`` when
    given) and write the report; returns it. ``cloze_contexts``: K, the other stories' contexts that
    estimate an ending's prior for the PMI and ending-only Story Cloze rules; ``compute_dtype``: in
    place of the run's own."""
    if split not in EVAL_SPLITS:
        raise ConfigError(f"split must be one of {EVAL_SPLITS}, got {split!r}")
    check_count("rollout_steps", rollout_steps)
    check_count("examples", num_examples)
    check_count("cloze_contexts", cloze_contexts)
    if compute_dtype is not None:
        check_compute_dtype(compute_dtype)
    if data_path is not None and not any(p.strip() for p in data_path.split(",")):
        raise ConfigError(f"--data names no file: {data_path!r} (one path, or several separated by commas)")
    check_own_paths(workdir, ("eval", "plots"))  # the report's directories: never a link out of the workdir
    clock = time.perf_counter()
    run, params, evaluators = restore_for_evaluation(workdir, step, compute_dtype)
    if data_path is None:
        check_same_data(run, workdir)
    stories, window_set, source = prepare_split(run.config, run.tokenizer, split, path=data_path)
    trained_on = check_held_out(run.config, stories, split, data_path)
    timings = {"load": time.perf_counter() - clock}
    report = {
        "workdir": os.path.abspath(workdir),
        "step": run.step,
        "split": split,
        "data": source,
        "stories": len(stories),
        "windows": int(len(window_set.windows)),
        "skipped_stories": window_set.n_skipped,
        "truncated_sentences": window_set.n_truncated,  # cut to N tokens
        "unk_rate": round(window_set.unk_rate, 4),  # of the windows' real tokens
        "trained_on_stories": trained_on,  # evaluated stories the run trained on (None: its data unreadable)
        "selection_loss": run.family.selection_loss,  # what "window_ce" measures for this family
        "selection": run.config.selection,  # the validation loss that selected the step: window or LS(T)
        "objective": objective_label(run.model_cfg),  # what the training loss averaged
        "prediction": run.family.prediction,  # what a predicted state Ŝ(T) is for this family
    }
    if not len(window_set.windows):
        report["note"] = "no windows in this split"
        return _write(workdir, report, data_path)
    options = {"num_examples": num_examples, "rollout_steps": rollout_steps, "cloze_contexts": cloze_contexts}
    report |= _evaluate(evaluators, params, run, stories, window_set, options, timings)
    timings["total"] = time.perf_counter() - clock
    report["timings_s"] = timings
    return _write(workdir, report, data_path)


@functools.cache
def eval_mesh(eval_batch_size: int) -> jax.sharding.Mesh:
    """Data parallel over as many devices as divide the eval batch; built once per size."""
    return sharding.make_mesh(max(d for d in range(1, jax.device_count() + 1) if eval_batch_size % d == 0), 1)


def check_same_data(run, workdir: str) -> None:
    """A DataError when the run's own data files have other bytes than when its checkpoint was written:
    their split would not be the run's held-out split (a story moved between splits is trained on). A
    checkpoint written before fingerprints cannot be checked: the file it names is said, with a warning."""
    if run.data_fingerprint is None and run.config.data.source == "file":
        say(
            f"rank4jax: warning: {workdir}'s checkpoint {run.step} records no fingerprint of its data: evaluating "
            f"on {run.config.data.path} as it is now (the run's splits only if that file is unchanged)"
        )
    if run.data_fingerprint is not None and data_fingerprint(run.config) != run.data_fingerprint:
        raise DataError(
            f"the data at {run.config.data.path} has changed since {workdir}'s checkpoint {run.step} was written "
            "(or cannot be read): its splits are no longer the run's; evaluate on a file named with --data"
        )


def restore_for_evaluation(workdir: str, step: str | int = "best", compute_dtype: str | None = None):
    """(SavedRun, parameters, Evaluators) of a checkpoint, on an evaluation mesh: data parallel over as
    many devices as divide the eval batch (independent of the training mesh), computing in the run's
    ``compute_dtype`` unless one is given. A damaged checkpoint, or one a running training deletes
    meanwhile, falls back to another."""

    def place(run):
        params = run.abstract_state.params
        return sharding.with_shardings(params, sharding.state_shardings(eval_mesh(run.config.eval_batch_size), params))

    with RunCheckpoints(workdir, read_only=True) as ckpt:
        run, params = restore_run(ckpt, step, place)
    mesh = eval_mesh(run.config.eval_batch_size)
    sharding.check_batches_fit(
        run.config, run.tokenizer.vocab_size, mesh.shape[sharding.DATA_AXIS], ("eval_batch_size",)
    )
    policy = StepPolicy.of(run.config) if compute_dtype is None else StepPolicy(compute_dtype)
    optim = optim_key(run.config.optim, run.config.num_steps)
    programs = build_programs(run.family, run.model_cfg, optim, mesh, policy)
    layout = batch_layout(run.config, run.family, run.model_cfg, groups=mesh.shape[sharding.DATA_AXIS])
    return run, params, Evaluators(programs, run.config.eval_batch_size, layout)


def _evaluate(evaluators, params, run, stories, window_set, options: dict, timings: dict) -> dict:
    """Window metrics, the context measures, Story Cloze, decoded examples and the rollout, each
    timed into ``timings``."""

    def timed(name, fn, *args):
        start = time.perf_counter()
        out = fn(*args)
        timings[name] = time.perf_counter() - start
        return out

    tokenizer, model_cfg, t = run.tokenizer, run.model_cfg, run.model_cfg.n_slices
    windows, num_examples = window_set.windows, options["num_examples"]
    report = timed("windows", evaluators.windows, params, windows)
    if run.family.language_model and report.get("window_ce") is not None:  # next-token CE over every token
        report["perplexity"] = math.exp(report["window_ce"])
    report |= timed("other_context", evaluators.other_context, params, windows, window_set.story_index)
    if "last_slice_ce_other_context" in report:  # nats the story's own context is worth to S(T)
        report["context_gain"] = report["last_slice_ce_other_context"] - report["last_slice_ce"]
    pairs, labels = cloze_windows(stories, tokenizer, model_cfg.n_tokens, t)
    if 0 < len(pairs) <= options["cloze_contexts"]:
        say(f"rank4jax: warning: cloze_contexts={options['cloze_contexts']}: each of the {len(pairs):,} Story "
            f"Cloze stories can borrow {len(pairs) - 1:,} other contexts; K = {len(pairs) - 1:,} is used")  # fmt: skip
    report |= timed("cloze", evaluators.cloze, params, pairs, labels, options["cloze_contexts"])
    shown = windows[:num_examples]
    predicted = timed("examples", evaluators.predict, params, shown) if len(shown) else shown[:, 0]
    report["examples"] = [
        {
            "context": [tokenizer.decode(s) for s in window[:t]],
            "gold": tokenizer.decode(window[t]),
            "predicted": display_text(tokenizer, p),
        }
        for window, p in zip(shown, predicted, strict=True)
    ]
    if options["rollout_steps"]:
        n_steps = options["rollout_steps"]
        report |= timed("rollout", _rollout_report, evaluators, params, stories, run, n_steps, num_examples)
    return report


def _rollout_report(evaluators, params, stories, run, n_steps: int, num_examples: int) -> dict:
    tokenizer, model_cfg = run.tokenizer, run.model_cfg
    t = model_cfg.n_slices
    long_enough = [s for s in stories if len(s.sentences) >= t]
    if not long_enough:
        return {"rollout_mean_ce": [None] * n_steps, "rollout_stories": [0] * n_steps, "rollout_examples": []}
    lengths = np.array([len(s.sentences) for s in long_enough])
    states = np.full((len(long_enough), lengths.max(), model_cfg.n_tokens), PAD_ID, np.int32)
    for i, story in enumerate(long_enough):
        states[i, : lengths[i]] = encode_story(tokenizer, story.sentences, model_cfg.n_tokens)
    predicted, ces = evaluators.rollout(params, states, lengths, t, n_steps, show=num_examples)
    scored = ~np.isnan(ces)
    return {
        "rollout_mean_ce": [float(np.mean(c[m])) if m.any() else None for c, m in zip(ces.T, scored.T, strict=True)],
        "rollout_stories": [int(m.sum()) for m in scored.T],
        "rollout_examples": [
            {"context": list(story.sentences[:t]), "rollout": [display_text(tokenizer, p) for p in rolled]}
            for story, rolled in zip(long_enough[:num_examples], predicted, strict=False)
        ],
    }


def report_stem(data_path: str) -> str:
    """``<first file's name>-<8 hex digits of every file's absolute path>``: two files of the same
    name in different directories (or lists of files) get different reports."""
    paths = [os.path.abspath(p.strip()) for p in data_path.split(",") if p.strip()]
    digest = hashlib.sha256("\n".join(paths).encode()).hexdigest()[:8]
    return f"{os.path.splitext(os.path.basename(paths[0]))[0]}-{digest}"


def _write(workdir: str, report: dict, data_path: str | None = None) -> dict:
    name = f"{report['split']}_step{report['step']}.json"
    if data_path:  # another file's split: never overwrite the run's own reports, nor another file's
        name = f"{report_stem(data_path)}.{name}"
    try:
        report["path"] = files.write_json(workdir, os.path.join("eval", name), report)
    except WorkdirError as e:  # a read-only or full disk: the figures are still returned (and printed)
        report["path"], report["write_error"] = None, str(e)
    return report
