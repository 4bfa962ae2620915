"""SIGTERM during ``train``: a request the loop reads at its next step boundary, where it saves a
checkpoint through orbax and stops (a command then exits 143). Received while the run starts, it stops
at the first step; while it finishes, the run completes and then stops the command
(``StageInterrupted``). Ctrl-C is Python's own ``KeyboardInterrupt``, left to unwind the run and be
said once by the command's entry point (``rank4jax.cli.run_command``). In a multi-process run SIGTERM
is left to JAX's preemption notifier: the processes agree on the step through orbax
(``CheckpointManager.reached_preemption``)."""

from __future__ import annotations

import signal


class SigtermRequest:
    """Context manager: SIGTERM sets ``received`` (nothing else happens in the handler). Once one has
    arrived the handler stays after the run, so another while the process exits cannot kill it half-way."""

    def __init__(self, enabled: bool = True):
        self.received, self.enabled, self._previous = False, enabled, None

    def __enter__(self):
        if self.enabled:
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def _handle(self, signum, frame):
        del signum, frame
        self.received = True

    def __exit__(self, *exc):
        if self._previous is not None and not self.received:  # stopping: a second SIGTERM harms nothing
            signal.signal(signal.SIGTERM, self._previous)
