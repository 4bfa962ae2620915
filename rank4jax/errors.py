"""User-facing errors.

Every problem caused by user input (a file, a config value, a checkpoint) raises a subclass of
:class:`UserError` with one message that names the file, row or field at fault. The command-line
entry points print that message and exit non-zero without a stack trace; anything else is a bug
and keeps its traceback.
"""

import gc
import os
import sys
import threading


class UserError(Exception):
    """A problem with the user's input, reported as one clear message."""


class ConfigError(UserError, ValueError):
    """An invalid configuration value (names the field)."""


class DataError(UserError, ValueError):
    """A missing or malformed data file, or a token id outside the vocabulary."""


class CheckpointError(UserError):
    """A checkpoint that cannot be used with this run (missing, or from another config)."""


class WorkdirError(UserError):
    """A workdir that cannot be written (read-only, no permission, not a directory)."""


class WorkdirBusyError(UserError):
    """Another live process holds the workdir's lock (one training run per workdir)."""


class TrainingDivergedError(UserError):
    """The loss or gradient norm became NaN or infinite."""


SIGNAL_STATUS = {"SIGINT": 130, "SIGTERM": 143}  # 128 + the signal number, as a shell reports it


class SignalInterrupt(KeyboardInterrupt):
    """SIGINT/SIGTERM while a run starts (``training.signals``): nothing was saved; ``signum`` says which."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def interrupt(signum: int, frame, error: BaseException) -> None:
    """Raise ``error`` from a signal handler whose ``frame`` is where the signal landed. Inside a
    garbage-collection callback (JAX runs one at every collection) Python would only print it
    ("Exception ignored in …") and go on: there the signal is sent again 10 ms later instead, by when
    a collection is over (a young generation's takes well under a millisecond; a full one of a large
    heap can take longer, and a signal then landing in one of its weakref callbacks is printed)."""
    callbacks = {getattr(callback, "__code__", None) for callback in gc.callbacks}
    while frame is not None and frame.f_code not in callbacks:
        frame = frame.f_back
    if frame is None:
        raise error
    resend = threading.Timer(0.01, os.kill, (os.getpid(), signum))
    resend.daemon = True  # never holds up the interpreter's exit
    resend.start()


class StageInterrupted(Exception):
    """A stage of a multi-stage command (one training run of compare.py, zpx_plan.py, splm_report.py)
    stopped on SIGINT/SIGTERM after saving its checkpoint; the command stops there with ``status``."""

    def __init__(self, message: str, signal_name: str):
        super().__init__(message)
        self.status = SIGNAL_STATUS.get(signal_name, 1)


class RecompilationError(RuntimeError):
    """A jitted step compiled for more batch shapes than its layout can produce (a bug, not user input)."""


def say(line: str) -> None:
    """Write one message line to stderr in a single call and flush it. ``print`` writes the text and
    its newline separately, so a signal handled between the two (Ctrl-C during a warning) glued the
    next message onto the unfinished line."""
    sys.stderr.write(f"{line}\n")
    sys.stderr.flush()
