"""A run's own files in its workdir, read and written by every layer that needs them: the metrics log
(``metrics.jsonl``, one JSON record a line), the resolved config and the training summary (JSON), and
the best validated step the log names. The training loop writes the log (``training.metrics``);
checkpoints, evaluation and the experiments read it."""

from __future__ import annotations

import json
import os

from rank4jax import files
from rank4jax.errors import say

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "train_summary.json"  # written by the training loop at the end of a run
CONFIG_FILE = "config.json"  # the run's resolved config, written when it starts
LOCK_FILE = ".lock"  # the one-writer lock (rank4jax.training.workdir_lock)
CHECKPOINT_DIR = "checkpoints"  # orbax's checkpoint directories, one per step
DAMAGED_DIR = "damaged_checkpoints"  # where training moves a checkpoint it cannot read (rank4jax.runs)


# the files and directories a run writes in its workdir (besides the TensorBoard event files)
OWN_PATHS = (LOCK_FILE, CONFIG_FILE, METRICS_FILE, SUMMARY_FILE, CHECKPOINT_DIR, DAMAGED_DIR)
OWN_PATHS += ("eval", "plots", os.path.join("plots", "curves.png"), "profile")


def check_own_paths(workdir: str, names=OWN_PATHS) -> None:
    """Every one of the run's own paths in ``workdir`` (and each checkpoint step directory) as the
    writer takes it (``rank4jax.files.path_in``): a crafted workdir is refused before anything is written."""
    checkpoints = os.path.join(workdir, CHECKPOINT_DIR)
    steps = sorted(os.listdir(checkpoints)) if CHECKPOINT_DIR in names and os.path.isdir(checkpoints) else []
    if not os.path.islink(checkpoints):
        names = (*names, *(os.path.join(CHECKPOINT_DIR, step) for step in steps))
    files.check_paths(workdir, names)


def read_json(path: str, what: str) -> dict | None:
    """A JSON object the run wrote, or None: absent, or damaged or not an object (with one warning
    naming it)."""
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        say(f"rank4jax: warning: {path} ({what}) is unreadable ({type(e).__name__}); read as absent")
        return None
    if not isinstance(value, dict):
        say(f"rank4jax: warning: {path} ({what}) holds a JSON {type(value).__name__}, not an object; read as absent")
        return None
    return value


def _records(path: str) -> tuple[list[tuple[tuple[str, int], dict]], list[int], int]:
    """metrics.jsonl's readable records in file order as ((split, step), record), the indices of its
    unreadable non-empty lines (undecodable bytes, not a record, no step, or without the numbers its
    split's readers need: ``REQUIRED``), and how many lines it has."""
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = [line.strip() for line in f if line.strip()]
    records, bad = [], []
    for number, line in enumerate(lines):
        try:
            record = json.loads(line)
            split = str(record.get("split", "train"))
            if not all(_is_number(record.get(key)) for key in REQUIRED.get(split, ())):
                raise ValueError(f"a {split} record without {REQUIRED[split]}")
            records.append(((split, int(record["step"])), record))
        except (ValueError, KeyError, TypeError, AttributeError):
            bad.append(number)
    return records, bad, len(lines)


REQUIRED = {"train": ("loss", "windows_per_s"), "validation": ("window_ce", "last_slice_ce")}  # per split, numbers


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def read_metrics(workdir: str) -> dict[str, list[dict]]:
    """{split: records sorted by step}, last record per (split, step). Unreadable lines are skipped:
    the last one silently (a line cut short by a hard kill, rewritten when the run resumes), any
    other with one warning naming how many."""
    path = os.path.join(workdir, METRICS_FILE)
    records, bad, n_lines = _records(path) if os.path.isfile(path) else ([], [], 0)
    latest = dict(records)
    if [n for n in bad if n != n_lines - 1]:
        say(f"rank4jax: warning: {path}: {len(bad)} unreadable line(s) skipped")
    out: dict[str, list[dict]] = {}
    for (split, _), record in sorted(latest.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        out.setdefault(split, []).append(record)
    return out


def best_validated(workdir: str, steps, key: str) -> tuple[int, float] | None:
    """(step, loss) of the lowest validation ``key`` (the run's selection loss) the log records at one of
    ``steps`` (the checkpoints on disk), the earliest on a tie; None when it records none of them."""
    on_disk = set(steps)
    losses = [(r[key], r["step"]) for r in read_metrics(workdir).get("validation", []) if r["step"] in on_disk]
    losses = [(loss, step) for loss, step in losses if isinstance(loss, int | float) and loss == loss]
    if not losses:
        return None
    loss, step = min(losses)
    return step, float(loss)
