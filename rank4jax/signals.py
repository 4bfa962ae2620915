"""The one way a command stops early, standard library only. Ctrl-C is noted while a command runs
(:func:`noted`) and raised as Python's own KeyboardInterrupt at the next :func:`check` (each training
step, each evaluation batch, the end of the imports or of the work): raised anywhere, it can land in an
extension's import or a callback JAX's C++ code makes, where it crashes the process or is only printed.
From Python (a notebook, a test) nothing is installed. SIGTERM during ``train`` is a request the loop
reads at its next step boundary, where it saves through orbax and stops (status 143); in a multi-process
run it is JAX's preemption notifier's, the processes agreeing on the step through orbax."""

import contextlib
import signal
import sys

STARTING = "stopped: Ctrl-C while starting; nothing was read or written"
_noted: list[int] = []


def check() -> None:
    """Raise KeyboardInterrupt here if a Ctrl-C was noted."""
    if _noted:
        _noted.clear()
        raise KeyboardInterrupt


@contextlib.contextmanager
def noted():
    """Ctrl-C noted for :func:`check` inside the block (the handler before it comes back after it)."""
    previous = signal.signal(signal.SIGINT, lambda signum, frame: _noted.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def importing():
    """Around a command's imports and flag definitions: a Ctrl-C while they run is one line and status
    130 once they are done."""
    with noted():
        yield
    if _noted:
        _noted.clear()
        sys.stderr.write(STARTING + "\n")
        sys.exit(130)


class SigtermRequest:
    """Context manager: SIGTERM sets ``received`` (nothing else happens in the handler). Once one has
    arrived the handler stays after the run, so another while the process exits cannot kill it half-way."""

    def __init__(self, enabled: bool = True):
        self.received, self.enabled, self._previous = False, enabled, None

    def __enter__(self):
        if self.enabled:
            self._previous = signal.signal(signal.SIGTERM, lambda signum, frame: setattr(self, "received", True))
        return self

    def __exit__(self, *exc):
        if self._previous is not None and not self.received:  # stopping: a second SIGTERM harms nothing
            signal.signal(signal.SIGTERM, self._previous)
