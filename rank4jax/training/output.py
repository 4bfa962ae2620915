"""A training run's one output channel: metrics.jsonl and TensorBoard (``metrics.MetricsWriter``),
the progress bar and the log lines (process 0 only), and the run summary at the end."""

from __future__ import annotations

import json
import os
import time

import jax
import numpy as np
from tqdm.auto import tqdm

from rank4jax import files
from rank4jax.errors import TrainingDivergedError
from rank4jax.models.family import objective_label
from rank4jax.models.flops import train_flops_per_window
from rank4jax.training.metrics import (
    CONFIG_FILE,
    SUMMARY_FILE,
    MetricsWriter,
    plot_curves,
    read_json,
    read_metrics,
    rewind_metrics,
    training_seconds,
)
from rank4jax.training.utilization import peak_flops, utilization


class Output:
    def __init__(self, run, start: int, trains: bool = True):
        self.run, self.start = run, start
        # run.step_fn.flops_done at the last train record (from here: not the layout choice's timed steps)
        self.flops_logged = run.step_fn.flops_done
        if run.is_main:  # each step once, however the last run ended (at 0: one that saved no checkpoint)
            rewind_metrics(run.workdir, start)
        # The resolved config of this start (overrides, layout, data fingerprint), when it trains: a
        # finished run's record keeps the settings it was trained with, whatever a rerun asks for.
        if run.is_main and trains:
            files.write_json(run.workdir, CONFIG_FILE, run.saved_config)
        self.writer = MetricsWriter(run.workdir, enabled=run.is_main)
        self.bar = tqdm(
            total=run.config.num_steps,
            initial=start,
            disable=not (run.config.progress_bar and run.is_main),
            unit="step",
            dynamic_ncols=True,
        )
        self.pending, self.since = [], time.perf_counter()  # the step metrics not yet fetched, and since when
        # the train step's analytic FLOPs per window, the devices sharing them, the device's peak in
        # the run's compute dtype (rank4jax.training.utilization)
        self.flops = (
            train_flops_per_window(run.family, run.model_cfg),
            run.programs.mesh.devices.size,
            peak_flops(run.programs.mesh.devices.flat[0], run.config.compute_dtype),
        )

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        self.bar.close()
        self.writer.close(quiet=exc_type is not None)  # a failing run's own error says why

    def say(self, text: str) -> None:
        if self.run.is_main:
            self.bar.write(text)

    def announce(self, early) -> None:
        run, start = self.run, self.start
        if early.stopped:
            self.say(
                f"rank4jax: {run.workdir} stopped early at step {start} (best step {early.best_step}); nothing to train"
            )
        elif start == 0:
            self.say(
                f"rank4jax: {run.family.name} model, {run.n_params:,} parameters; data {json.dumps(run.data.summary())}"
            )
            mesh = run.programs.mesh
            self.say(f"rank4jax: mesh {dict(mesh.shape)} over {mesh.devices.size} of {jax.device_count()} devices")
        elif start >= run.config.num_steps:
            self.say(f"rank4jax: {run.workdir} is at step {start}, num_steps={run.config.num_steps}: nothing to train")
        else:
            self.say(f"rank4jax: resuming {run.workdir} from step {start}")

    def start_clock(self) -> None:
        """The first training interval starts now: after the train step's compilation, which the
        logged intervals (and so ``training_time_s``) leave out."""
        self.since = time.perf_counter()

    def step_done(self, metrics: dict) -> None:
        self.pending.append(metrics)  # stays on the device: no host sync per step
        self.bar.update(1)

    def log_train(self, step: int) -> None:
        record = _train_record(self.pending, step, self.since, self.run.config.batch_size, self.start)
        # what the compiled steps really computed (PAD positions skipped); XLA's count of a sharded
        # program is its per-device part
        done, self.flops_logged = self.run.step_fn.flops_done - self.flops_logged, self.run.step_fn.flops_done
        analytic, n_devices, peak = self.flops
        record |= utilization(record["windows_per_s"], analytic, done / record["interval_s"], n_devices, peak)
        self.writer.write(record)
        shown = {"loss": f"{record['loss']:.3f}", "lr": f"{record['learning_rate']:.2g}"}
        shown["win_s"] = f"{record['windows_per_s']:.0f}"
        shown["tflops"] = f"{record['xla_flops_per_s_per_device'] / 1e12:.3g}"
        if "mfu" in record:
            shown["mfu"] = f"{record['mfu']:.1%}"
        self.bar.set_postfix(shown)
        self.pending, self.since = [], time.perf_counter()

    def log_validation(self, step: int, metrics: dict) -> None:
        self.writer.write({"step": step, "split": "validation", **metrics})
        self.say(
            f"step {step}: val {self.run.family.selection_loss} {metrics['window_ce']:.4f}, "
            f"LS(T) {metrics['last_slice_ce']:.4f}, token acc {metrics['token_accuracy']:.3f}"
            + ("" if self.run.config.selection == "window" else " (selected on LS(T))")
        )
        self.since = time.perf_counter()  # the validation pass is not training time


def _train_record(pending: list, step: int, since: float, batch_size: int, resumed_at: int) -> dict:
    """Fetch the pending step metrics (this waits for the steps to finish: dispatch is asynchronous,
    so the interval is timed after the fetch, from ``since``, the end of the previous one)."""
    fetched = jax.device_get(pending)
    seconds = time.perf_counter() - since
    losses = np.array([m["loss"] for m in fetched], np.float64)
    norms = np.array([m["grad_norm"] for m in fetched], np.float64)
    bad = ~(np.isfinite(losses) & np.isfinite(norms))
    if bad.any():
        i = int(np.argmax(bad))
        advice = "Try a lower optim.learning_rate or set optim.grad_clip_norm."
        if resumed_at and step - len(fetched) == resumed_at:  # right after a resume: suspect the checkpoint
            advice = (
                f"This is the first interval after resuming from checkpoint {resumed_at}: its optimiser state "
                f"may be damaged; move checkpoints/{resumed_at} aside to resume from the one before (if that "
                "diverges too, lower optim.learning_rate)."
            )
        raise TrainingDivergedError(
            f"training diverged at step {step - len(fetched) + 1 + i}: loss={losses[i]}, grad_norm={norms[i]}. "
            f"Stopped without saving; the checkpoints already in the workdir are intact. {advice}"
        )
    ls_tokens = sum(float(m["last_slice_tokens"]) for m in fetched)
    return {
        "step": step,
        "split": "train",
        "loss": float(losses.mean()),
        "last_slice_ce": sum(float(m["last_slice_ce_sum"]) for m in fetched) / max(ls_tokens, 1.0),
        "grad_norm": float(norms.mean()),  # L2 norms (big_vision): gradient and update means over
        "update_norm": float(np.mean([m["update_norm"] for m in fetched])),  # the interval,
        "param_norm": float(fetched[-1]["param_norm"]),  # parameters after its last step
        "learning_rate": float(fetched[-1]["learning_rate"]),  # the rate of its last step's update
        "windows_per_s": len(fetched) * batch_size / max(seconds, 1e-9),
        "interval_s": seconds,  # the interval's wall time (metrics.training_seconds sums them)
    }


def _training_time(run) -> dict:
    """The run's training time over every start (``metrics.training_seconds``), in all and to its
    best checkpoint (None without one). It is the run's one training time: a killed process never
    writes its summary, but its logged intervals stay in metrics.jsonl."""
    records, best = read_metrics(run.workdir).get("train", []), run.ckpt.best_step()
    return {
        "training_time_s": training_seconds(records, run.config.batch_size),
        "training_time_to_best_s": None if best is None else training_seconds(records, run.config.batch_size, best),
    }


def write_summary(run, actions, start: int, final_step: int, elapsed: float) -> dict:
    """``train_summary.json`` (merged with the previous run's when this one resumed) and, unless
    ``config.plots`` is off, the curves."""
    summary_path = os.path.join(run.workdir, SUMMARY_FILE)
    previous = (read_json(summary_path, "the training summary") or {}) if start > 0 else {}
    previous = previous if isinstance(previous, dict) else {}
    ran = final_step > start  # rerunning a finished run trains nothing: its time and figures stay
    elapsed = elapsed if ran else 0.0
    summary = {
        "workdir": os.path.abspath(run.workdir),
        "model_family": run.family.name,
        "selection_loss": run.family.selection_loss,  # what "window_ce" measures for this family
        "selection": run.config.selection,  # which validation loss selects: "window" or "last_slice" (LS(T))
        "objective": objective_label(run.model_cfg),  # what the training loss averages
        "parameters": run.n_params,
        "step": final_step,
        "best_step": run.ckpt.best_step(),
        "interrupted": actions.interrupted,
        "early_stopped": actions.early.stopped,  # stopped by early_stop_patience before num_steps
        "wall_time_s": elapsed,  # this start's process, validation and saves included
        **_training_time(run),  # from the logged intervals: kept however an earlier process ended
        "final_validation": actions.last_val if ran else previous.get("final_validation"),
        "batch_layout": run.layout.name,  # what the train step consumed: full, trimmed or compact batches
        "compiled_train_step": run.step_fn.peak_memory() if ran else previous.get("compiled_train_step"),
        "data": run.data.summary(),
    }
    if run.is_main:
        files.write_json(run.workdir, SUMMARY_FILE, summary)
        if run.config.plots:
            plot_curves(run.workdir)
    return summary
