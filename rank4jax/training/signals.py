"""SIGINT/SIGTERM during training: a flag the loop checks after every step."""

from __future__ import annotations

import signal

from rank4jax.errors import say


class StopRequest:
    """Turns SIGINT/SIGTERM into a flag the loop checks after every step. It stays installed until
    the last checkpoint is written, so a second signal during that save cannot cut it short.

    Single process only (``enabled``): a flag set in one process of a multi-process run would make
    it save alone; there JAX's preemption notifier keeps SIGTERM and the processes agree on a step."""

    def __init__(self, enabled: bool = True):
        self.signal: int | None = None
        self.enabled = enabled
        self._previous = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM) if self.enabled else ():
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.signal is not None:
            say(f"rank4jax: {signal.Signals(signum).name} again: still saving the checkpoint")
        self.signal = self.signal or signum

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    @property
    def name(self) -> str | None:
        return signal.Signals(self.signal).name if self.signal else None
