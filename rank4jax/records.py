"""A run's own files in its workdir, read by every layer that needs them: the metrics log
(``metrics.jsonl``, one JSON record a line, written by ``training.metrics``), the resolved config and the
training summary (JSON), and the best validated step the log names."""

from __future__ import annotations

import json
import os

from rank4jax import files
from rank4jax.errors import say

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "train_summary.json"  # written at the end of a run
CONFIG_FILE = "config.json"  # the run's resolved config, written when it starts
LOCK_FILE = ".lock"  # the one-writer lock (rank4jax.training.workdir_lock)
CHECKPOINT_DIR = "checkpoints"  # orbax's checkpoint directories, one per step
DAMAGED_DIR = "damaged_checkpoints"  # where training moves a checkpoint it cannot read (rank4jax.runs)
# what a run writes in its workdir (besides the TensorBoard event files)
OWN_PATHS = (LOCK_FILE, CONFIG_FILE, METRICS_FILE, SUMMARY_FILE, CHECKPOINT_DIR, DAMAGED_DIR, "eval", "plots",
             os.path.join("plots", "curves.png"), "profile")  # fmt: skip
REQUIRED = {"train": ("loss", "windows_per_s"), "validation": ("window_ce", "last_slice_ce")}  # numbers, per split


def check_own_paths(workdir: str, names=OWN_PATHS) -> None:
    """The run's own paths in ``workdir`` (and each checkpoint step directory) as the writer takes them
    (``rank4jax.files``): a crafted workdir is refused before anything is written."""
    checkpoints = os.path.join(workdir, CHECKPOINT_DIR)
    if CHECKPOINT_DIR in names and os.path.isdir(checkpoints) and not os.path.islink(checkpoints):
        names = (*names, *(os.path.join(CHECKPOINT_DIR, step) for step in sorted(os.listdir(checkpoints))))
    for name in names:
        files.path_in(workdir, name)


def read_json(path: str, what: str) -> dict | None:
    """A JSON object the run wrote; None when absent, or damaged or not an object (with one warning)."""
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


def log_records(path: str) -> tuple[list[tuple[tuple[str, int], dict]], list[int], int]:
    """A metrics log's readable records in file order as ((split, step), record), the indices of its
    unreadable non-empty lines (not JSON, no step, or without the numbers ``REQUIRED`` for its split),
    and its number of lines."""
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = [line.strip() for line in f if line.strip()]
    records, bad = [], []
    for number, line in enumerate(lines):
        try:
            record = json.loads(line)
            split = str(record.get("split", "train"))
            if not all(isinstance(record.get(k), int | float) and not isinstance(record.get(k), bool)
                       for k in REQUIRED.get(split, ())):  # fmt: skip
                raise ValueError(f"a {split} record without {REQUIRED[split]}")
            records.append(((split, int(record["step"])), record))
        except (ValueError, KeyError, TypeError, AttributeError):
            bad.append(number)
    return records, bad, len(lines)


def read_metrics(workdir: str) -> dict[str, list[dict]]:
    """{split: records sorted by step}, the last record per (split, step). Unreadable lines are skipped:
    the last one silently (cut short by a hard kill, rewritten when the run resumes), others with one
    warning naming how many."""
    path = os.path.join(workdir, METRICS_FILE)
    records, bad, n_lines = log_records(path) if os.path.isfile(path) else ([], [], 0)
    if [n for n in bad if n != n_lines - 1]:
        say(f"rank4jax: warning: {path}: {len(bad)} unreadable line(s) skipped")
    out: dict[str, list[dict]] = {}
    for (split, _), record in sorted(dict(records).items(), key=lambda kv: kv[0]):
        out.setdefault(split, []).append(record)
    return out


def best_validated(workdir: str, steps, key: str) -> tuple[int, float] | None:
    """(step, loss) of the lowest validation ``key`` (the selection loss) the log records at one of
    ``steps`` (the checkpoints on disk), the earliest on a tie; None when it records none of them."""
    on_disk = set(steps)
    records = [r for r in read_metrics(workdir).get("validation", []) if r["step"] in on_disk]
    losses = [(r[key], r["step"]) for r in records if isinstance(r.get(key), int | float) and r[key] == r[key]]
    if not losses:
        return None
    loss, step = min(losses)
    return step, float(loss)
