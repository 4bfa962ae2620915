"""The profiler switch: ``config.profile_steps = "first:last"`` writes a ``jax.profiler`` trace of
those train steps (and of any validation between them) under ``<workdir>/profile/`` — an XPlane file
for TensorBoard's profile plugin and a Perfetto trace (``perfetto_trace.json.gz``, ui.perfetto.dev).
Each step is a ``StepTraceAnnotation`` ("train", its number), validation a ``TraceAnnotation``
("evaluation"), and the models name their parts with ``jax.named_scope`` (attention, mlp, readout).
Only process 0 traces. The trace never stops a run: a trace that cannot be started or written
(a full disk, an unwritable directory) is one warning, and training goes on; what a trace that could
not be written left of itself is removed (a partial trace on a full disk would take the space the
next checkpoint needs)."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil

import jax

from rank4jax.engine.run_config import profile_range
from rank4jax.errors import say as warn

PROFILE_DIR = "profile"


class Profiler:
    def __init__(self, workdir: str, steps: str, enabled: bool = True, say=print):
        self.range = profile_range(steps) if enabled else None
        self.directory = os.path.join(workdir, PROFILE_DIR)
        self.say = say  # the run's log line (above the progress bar)
        self.first = None  # the first traced step while tracing, else None
        self.before: set[str] = set()  # the trace directories there before this trace

    def step(self, step: int):
        """A context around train step ``step``: starts the trace at the first step of the range
        this run executes (a resumed run traces what is left of it), names the step while tracing."""
        if self.range and self.first is None and self.range[0] <= step <= self.range[1]:
            try:
                self.before = set(self._traces())
                jax.profiler.start_trace(self.directory, create_perfetto_trace=True)
                self.first = step
            except Exception as e:  # noqa: BLE001 -- the trace is an extra: never the reason a run stops
                self._give_up("cannot start the profile", e)
        if self.first is None:
            return contextlib.nullcontext()
        return jax.profiler.StepTraceAnnotation("train", step_num=step)

    def step_done(self, step: int, outputs) -> None:
        """After step ``step``'s dispatch: at the last step of the range, wait for it and stop."""
        if self.first is not None and step == self.range[1]:
            self.stop(outputs, step)

    def stop(self, outputs=None, step: int | None = None) -> None:
        if self.first is not None:
            jax.block_until_ready(outputs)
            steps = f"steps {self.first}-{step}" if step is not None else f"the steps from {self.first}"
            self.first = None
            try:
                jax.profiler.stop_trace()
            except Exception as e:  # noqa: BLE001
                for partial in set(self._traces()) - self.before:  # what this trace left of itself
                    shutil.rmtree(partial, ignore_errors=True)
                self._give_up(f"the profile of {steps} was not written", e)
                return
            self.say(f"rank4jax: profile of {steps} written under {self.directory}")

    def _traces(self) -> list[str]:
        return glob.glob(os.path.join(self.directory, "plugins", "profile", "*"))

    def _give_up(self, what: str, error: Exception) -> None:
        self.range = None
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        warn(f"rank4jax: warning: {what} under {self.directory}: {reason}; training goes on without it")
