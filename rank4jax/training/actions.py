"""What the training loop does after every step, in order: note a preemption, log the train
metrics, validate (and judge early stopping), checkpoint, and say whether to stop."""

from __future__ import annotations

import jax
import numpy as np

from rank4jax.errors import TrainingDivergedError
from rank4jax.models.family import SELECTIONS
from rank4jax.records import read_metrics


class PeriodicActions:
    def __init__(self, run, out, early, stop):
        self.run, self.out, self.early, self.stop = run, out, early, stop
        self.last_val = None  # the latest validation's metrics
        self.interrupted = None  # "SIGTERM" when one stopped the run
        self.selection = SELECTIONS[run.config.selection]  # the validation metric that selects

    def __call__(self, step: int, state, batches) -> bool:
        """The actions after ``step``; True when the run stops here."""
        config, ckpt = self.run.config, self.run.ckpt
        # SIGTERM here, or a preemption every process of a multi-process run agreed on at this step
        signalled = self.stop.received or ckpt.reached_preemption(step)
        is_last = step == config.num_steps
        # a signal skips a validation to save at once, but not the last one: the run is ending anyway,
        # and its final checkpoint must carry its loss to be selectable
        validate_now = (step % config.eval_every == 0 and not signalled) or is_last
        if step % config.log_every == 0 or validate_now or is_last or signalled:
            self.out.log_train(step)
        if validate_now:
            self.validate(step, state)
        # a signal (before this step's validation, or during it) saves now: a step saved without a logged
        # validation is never the best one, and a resumed run validates at its next boundary; with early
        # stopping every validated step is checkpointed (its state resumes from them)
        signalled = signalled or self.stop.received
        if signalled or step % config.checkpoint_every == 0 or is_last or (self.early.patience and validate_now):
            self.run.lock.check(step)  # still this run's workdir: nothing is written otherwise
            ckpt.save(step, state, batches, self.run.saved_config, self.run.tokenizer)
        if signalled:
            self.interrupted = "SIGTERM"
        return signalled or self.early.stopped

    def validate_the_end(self, step: int, state) -> None:
        """A finished run whose last step has no logged validation (an older version saved it so at a
        signal during its last validation): validate it now and log it, so the run selects the same
        best step as an uninterrupted one."""
        if step != self.run.config.num_steps:
            return
        if any(r["step"] == step for r in read_metrics(self.run.workdir).get("validation", [])):
            return
        metrics = self.run.evaluators.windows(state.params, self.run.val_windows)
        self.run.lock.check(step)
        self.out.log_validation(step, metrics)
        self.out.say(f"step {step}: its checkpoint had no logged validation loss: {metrics[self.selection]:.4f} added")

    def validate(self, step: int, state) -> None:
        with jax.profiler.TraceAnnotation("evaluation"):  # named in a profile (training.profiling)
            metrics = self.run.evaluators.windows(state.params, self.run.val_windows)
        if not np.isfinite(metrics["window_ce"]):
            raise TrainingDivergedError(f"validation loss is {metrics['window_ce']} at step {step}; not saved")
        self.out.log_validation(step, metrics)
        self.last_val = metrics
        if self.early.update(step, metrics[self.selection]):
            self.out.say(
                f"step {step}: stopping early: no improvement of the validation {self.run.selection_label} "
                f"in {self.early.patience} validations (best {self.early.best:.4f} at step {self.early.best_step})"
            )
