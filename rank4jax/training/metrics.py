"""Metrics files and curves: an append-only JSONL log in the workdir, the same scalars as TensorBoard
event files beside it (tensorboardX: no TensorFlow needed; ``tensorboard --logdir runs/``), and PNG
plots of the log.

Records are ``{"step": int, "split": "train" | "validation", ...}``; each number is the TensorBoard
scalar ``<split>/<name>``. A run first rewinds the file to the step it starts from (its checkpoint's,
or 0: ``rewind_metrics``), so each step is logged once (TensorBoard's event files may show a re-trained
step twice).
"""

from __future__ import annotations

import json
import os

from rank4jax import files
from rank4jax.errors import WorkdirError, say
from rank4jax.records import (  # noqa: F401 -- the run's files, read here and by the commands
    CONFIG_FILE,
    METRICS_FILE,
    SUMMARY_FILE,
    log_records,
    read_json,
    read_metrics,
)


class EventFile:
    """A TensorBoard event file through tensorboardX's ``SummaryWriter``, flushed after every record so
    a storage fault (a full disk) is an ``OSError`` here; its writer thread may print the same fault's
    traceback before the run's own warning. (tensorboardX imports PyTorch when it is installed, to
    accept torch tensors: about 2 s of start-up on such a machine.)"""

    def __init__(self, workdir: str):
        from tensorboardX import SummaryWriter

        self._writer = SummaryWriter(logdir=workdir)

    def add_scalars(self, scalars: dict, step: int) -> None:
        for name, value in scalars.items():
            self._writer.add_scalar(name, value, global_step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class MetricsWriter:
    """Appends JSON lines and TensorBoard scalars; only JAX process 0 writes (every process computes
    the same metrics). A context manager: leaving it flushes and closes the event file."""

    def __init__(self, workdir: str, enabled: bool = True):
        self.path = os.path.join(workdir, METRICS_FILE)
        self.workdir = workdir
        self.enabled = enabled
        self._events = None  # the event file, opened at the first record (False: given up)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        self.close(quiet=exc_type is not None)

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        try:
            if self._events is None:  # opened first: once metrics.jsonl exists, so does the event file
                files.path_in(self.workdir, "")  # its folder: the workdir itself, checked by the writer
                self._events = EventFile(self.workdir)
        except OSError as e:
            raise WorkdirError(f"cannot write {e.filename or self.workdir}: {e.strerror}") from None
        files.append_line(self.workdir, METRICS_FILE, json.dumps(record))
        split = record.get("split", "train")
        scalars = {
            f"{split}/{name}": value
            for name, value in record.items()
            if name != "step" and isinstance(value, int | float) and not isinstance(value, bool)
        }
        if self._events:
            try:
                self._events.add_scalars(scalars, int(record["step"]))
            except OSError as e:  # metrics.jsonl has the record: the run goes on without the event file
                self._events = False
                say(f"rank4jax: warning: the TensorBoard event file in {self.workdir} stops here: {e.strerror}")

    def close(self, quiet: bool = False) -> None:
        """Flush and close the event file; ``quiet`` when the run is failing (its own error says why)."""
        if self._events:
            events, self._events = self._events, None
            try:
                events.close()  # flushes: a full disk fails here
            except OSError as e:
                if not quiet:
                    say(f"rank4jax: warning: the TensorBoard event file in {self.workdir} is incomplete: {e.strerror}")


def rewind_metrics(workdir: str, step: int) -> None:
    """Before a run resumes from checkpoint ``step`` (or starts at 0 over a run that saved none): rewrite
    metrics.jsonl with its readable records up to ``step``, each (split, step) once (the last), so the
    steps trained again are not logged twice and a line cut short by a crash is not glued to the next
    record. Written beside, then moved over."""
    path = os.path.join(workdir, METRICS_FILE)
    if not os.path.isfile(path):
        return
    kept: dict[tuple[str, int], dict] = {}
    for key, record in log_records(path)[0]:
        if key[1] <= step:
            kept.pop(key, None)
            kept[key] = record
    files.write_text(workdir, METRICS_FILE, "".join(json.dumps(record) + "\n" for record in kept.values()))


def steady_ms_per_step(workdir: str, batch_size: int) -> float:
    """Median training ms/step over the logged intervals, the first (which holds the compile) left out
    unless it is the only one; NaN without training records."""
    train = read_metrics(workdir).get("train", [])
    rates = sorted(r["windows_per_s"] for r in (train[1:] or train))
    return 1e3 * batch_size / rates[len(rates) // 2] if rates else float("nan")


def training_seconds(train_records: list[dict], batch_size: int, until_step: int | None = None) -> float:
    """Wall seconds of the logged training intervals up to ``until_step`` (every one when None), over
    every process that trained the run: a resumed run's records continue the ones its checkpoint
    kept, so a process killed without writing its summary loses nothing here. Each interval runs from
    the end of the previous one (validation passes excluded; each start's compilation of the train
    step too, which happens before its first interval starts).
    Records written before ``interval_s`` was logged: their steps since the previous record × batch /
    windows_per_s."""
    total, previous = 0.0, 0
    for record in train_records:
        if until_step is not None and record["step"] > until_step:
            break
        steps = record["step"] - previous
        total += record.get("interval_s", steps * batch_size / record["windows_per_s"])
        previous = record["step"]
    return total


def selection_loss(workdir: str) -> str:
    """The run's selection-loss label (its family's, from the training summary), or a generic one."""
    summary = read_json(os.path.join(workdir, SUMMARY_FILE), "the training summary")
    return (summary.get("selection_loss") if isinstance(summary, dict) else None) or "selection loss"


def plot_curves(workdir: str) -> str | None:
    """Draw the training and validation loss (one axis) and the validation LS(T) against step (like
    the paper's Figures 3–4) into ``workdir/plots/curves.png``. Returns the path, or None if no data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = read_metrics(workdir)
    train, val = metrics.get("train", []), metrics.get("validation", [])
    if not train and not val:
        return None
    selection = selection_loss(workdir)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    panels = [  # (axis, [(records, key, label)], title): training and validation loss on one axis
        (axes[0], [(train, "loss", "training (objective)"), (val, "window_ce", "validation")], selection),
        (axes[1], [(val, "last_slice_ce", "validation")], "LS(T): the cross-entropy of S(T)"),
    ]
    for ax, curves, title in panels:
        for records, key, label in curves:
            points = [(r["step"], r[key]) for r in records if key in r]
            if not points:
                continue
            steps, values = zip(*points, strict=True)
            ax.plot(steps, values, marker="." if len(points) < 50 else None, label=label)
            if records is val:
                best = min(points, key=lambda p: p[1])
                ax.plot([best[0]], [best[1]], "o", mfc="none", ms=10, color="k", label=f"min {best[1]:.4f} @ {best[0]}")
        ax.ticklabel_format(axis="y", useOffset=False)  # a 0.0001-nat change is not drawn as a fall
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel("cross-entropy (nats)")
        ax.grid(alpha=0.3)
        if ax.get_lines():
            ax.legend()
    fig.tight_layout()
    try:
        return files.save_figure(fig, workdir, os.path.join("plots", "curves.png"), dpi=100)
    finally:
        plt.close(fig)


def main(argv=None) -> None:
    """``python -m rank4jax.training.metrics WORKDIR``: redraw WORKDIR/plots/curves.png."""
    import sys

    from rank4jax.cli import run_command
    from rank4jax.errors import say

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        say("usage: python -m rank4jax.training.metrics WORKDIR")
        sys.exit(2)
    path = run_command(lambda: plot_curves(args[0]))
    if path is None:
        say(f"error: no metrics in {os.path.join(args[0], METRICS_FILE)}")
        sys.exit(2)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
