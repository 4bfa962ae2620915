"""The one experiment runner behind ``compare.py``, ``zpx_plan.py`` and ``splm_report.py``: train
(or resume) a set of named runs under one workdir, evaluate each selected checkpoint, and write a
table beside them.

Each run is an ordinary resumable run in ``workdir/<name>``; a rerun after training only restores
and evaluates. A stage stopped by SIGTERM (its checkpoint saved) stops the command
(:class:`rank4jax.errors.StageInterrupted`: exit status 143); rerunning resumes that stage.
The commands differ only in which configs they build and how they tabulate.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import ml_collections

from rank4jax import files
from rank4jax.errors import ConfigError, StageInterrupted
from rank4jax.evaluation.evaluators import CLOZE_CONTEXTS
from rank4jax.evaluation.report import evaluate_run
from rank4jax.records import CHECKPOINT_DIR, CONFIG_FILE
from rank4jax.training.loop import train
from rank4jax.training.metrics import read_metrics, steady_ms_per_step


@dataclasses.dataclass
class RunResult:
    """One trained and evaluated run: its training summary, its evaluation report on the split, the
    logged curves, and any further reports (``extra``: label → report)."""

    name: str
    run_dir: str
    config: ml_collections.ConfigDict
    summary: dict
    report: dict
    curves: dict
    extra: dict = dataclasses.field(default_factory=dict)

    @property
    def best_val_ls(self) -> float:
        """The lowest validation LS(T) logged during training (nan when none)."""
        return min((r["last_slice_ce"] for r in self.curves.get("validation", [])), default=float("nan"))

    @property
    def ms_per_step(self) -> float:
        return steady_ms_per_step(self.run_dir, self.config.batch_size)


def run_all(
    configs: dict[str, ml_collections.ConfigDict],
    workdir: str,
    *,
    split: str,
    num_examples: int = 0,
    rollout_steps: int = 1,
    cloze_contexts: int = CLOZE_CONTEXTS,
    extra_evals: dict[str, dict] | None = None,
    train: Callable[[str, ml_collections.ConfigDict, str], dict | None] | None = None,
) -> dict[str, RunResult]:
    """Train every config in ``workdir/<name>`` in order, then evaluate its selected checkpoint on
    ``split``; ``extra_evals`` (label → ``evaluate_run`` keyword arguments) adds further evaluations.
    ``train(name, config, run_dir)`` trains one run (``train_stage`` when None); a run it returns None
    for is left out of the result, unevaluated."""
    check_experiment_workdir(workdir)
    results = {}
    for name, config in configs.items():
        run_dir = stage_dir(workdir, name)
        summary = (train or train_stage)(name, config, run_dir)
        if summary is None:
            continue
        options = {"num_examples": num_examples, "rollout_steps": rollout_steps, "cloze_contexts": cloze_contexts}
        report = evaluate_run(run_dir, split=split, **options)
        extra = {label: evaluate_run(run_dir, **kwargs) for label, kwargs in (extra_evals or {}).items()}
        results[name] = RunResult(name, run_dir, config, summary, report, read_metrics(run_dir), extra)
    return results


def check_experiment_workdir(workdir: str) -> None:
    """An experiment's workdir holds its runs in folders of their own: a file there, or a training run's
    own workdir (its config.json or checkpoints/), is refused before anything is written."""
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise ConfigError(f"--workdir={workdir} is not a directory")
    if any(os.path.lexists(os.path.join(workdir, own)) for own in (CONFIG_FILE, CHECKPOINT_DIR)):
        raise ConfigError(
            f"--workdir={workdir} is a training run's workdir (it holds {CONFIG_FILE} or {CHECKPOINT_DIR}/): an "
            "experiment keeps its runs in folders of their own; use another --workdir"
        )


def stage_dir(workdir: str, name: str) -> str:
    """``workdir/name``, a stage's run folder, every component below the workdir checked by the writer
    (a stage folder that is a link would train outside the workdir)."""
    return files.path_in(workdir, name)


def train_stage(name: str, config: ml_collections.ConfigDict, run_dir: str) -> dict:
    """Train (or resume) one named run; its summary. An interrupted one stops the command
    (:class:`StageInterrupted`): no evaluation of a half-trained run, no next stage."""
    summary = train(config, run_dir)
    if summary["interrupted"]:
        raise StageInterrupted(
            f"stage {name!r} ({run_dir}) interrupted by {summary['interrupted']} at step {summary['step']}; "
            "its checkpoint is saved: rerun the same command to resume from there"
        )
    return summary


def write_outputs(workdir: str, stem: str, result, table: str) -> None:
    """``workdir/<stem>.json`` (the result) and ``workdir/<stem>.md`` (the table)."""
    files.write_json(workdir, f"{stem}.json", result)
    if table:
        files.write_text(workdir, f"{stem}.md", table + "\n")
