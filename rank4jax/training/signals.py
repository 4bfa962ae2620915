"""SIGINT/SIGTERM during ``train``, in three phases:

- **starting** (locking the workdir, reading the data, compiling): nothing is saved yet, so the
  signal raises :class:`~rank4jax.errors.SignalInterrupt`; ``train`` unwinds (the lock released, what
  it created and left empty removed) and the command says so in one line;
- **training**: a flag the loop checks after every step: it saves a checkpoint, then stops;
- **finishing** (the last save, the summary, the curves): noted in one line and kept (``late``), so
  a late signal cannot cut the summary short; once the run is complete, ``train`` raises
  :class:`~rank4jax.errors.StageInterrupted` for it, so a command stops there (an experiment does not
  go on to its next stage) with the signal's exit status.
"""

from __future__ import annotations

import signal

from rank4jax.errors import SignalInterrupt, interrupt, say


class StopRequest:
    """The handler of SIGINT/SIGTERM for the whole of ``train``; ``training()`` and ``finishing()``
    move it on. ``signal``: the first signal of the training phase (the loop's flag).

    Single process only (``enabled``): a flag set in one process of a multi-process run would make
    it save alone; there JAX's preemption notifier keeps SIGTERM and the processes agree on a step."""

    def __init__(self, enabled: bool = True):
        self.signal: int | None = None
        self.late: int | None = None  # the first signal of the finishing phase
        self.starting: int | None = None  # a signal of the starting phase
        self.enabled = enabled
        self.phase = "starting"
        self._noted = set()  # the phases whose later signals have been noted (once each)
        self._previous = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM) if self.enabled else ():
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def training(self) -> None:
        """The loop starts. A signal of the starting phase whose SignalInterrupt was lost (raised inside
        a finalizer, where Python only prints it) is raised now."""
        if self.starting is not None:
            raise SignalInterrupt(self.starting)
        self.phase = "training"

    def finishing(self, stopped: bool) -> None:
        """The loop has ended (``stopped``: at its signal, which it saved for). A signal the loop never
        read (one while the last save finished) is kept as a late one: the run is complete, and the
        command stops after it with the signal's status."""
        if self.signal is not None and not stopped and self.late is None:
            self.late = self.signal
        self.phase = "finishing"

    def _handle(self, signum, frame):
        name = signal.Signals(signum).name
        if self.phase == "starting":
            self.starting = signum  # kept: raised in a finalizer, the exception would be lost
            interrupt(signum, frame, SignalInterrupt(signum))
            return
        if self.phase == "training" and self.signal is None:
            self.signal = signum
            return
        if self.phase == "finishing" and self.late is None:
            self.late = signum
        if self.phase not in self._noted:  # said once: ten signals in a second are one line
            self._noted.add(self.phase)
            say(f"rank4jax: {name} again: still saving the checkpoint" if self.phase == "training"
                else f"rank4jax: {name}: training has ended; writing its summary first, then stopping")  # fmt: skip

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    @property
    def name(self) -> str | None:
        return signal.Signals(self.signal).name if self.signal else None
