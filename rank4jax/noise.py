"""What orbax, TensorStore and asyncio print about failures this project reports itself, filtered
out in one place: ``install()``, called once by every command line (``cli.parse_flags``) and by the
test suite, never on import. A notebook that wants the same quiet calls it too.

- Log records (absl and asyncio loggers): orbax's warnings about what this project does on purpose
  (a preemption save without a validation loss, read-only managers for evaluation) or about the
  optional step metadata file, which orbax does without; its error logs and asyncio's "Task
  exception was never retrieved" about a failed save (a full disk: reported in one line by
  ``storage.storage_error``) or a failed read (reported by ``damage.first_readable``).
- Tracebacks: after a failed read or save, orbax's pending reads or writes of the other arrays fail
  in the background, and TensorStore's callbacks find asyncio's loop closed and print tracebacks
  (dozens, some after the read returned or the run stopped) through ``sys.unraisablehook`` or
  ``sys.excepthook``; those are dropped, anything else is passed on.
"""

from __future__ import annotations

import logging
import sys

STORAGE_FAILURES = ("No space left on device", "Disk quota exceeded", "Read-only file system", "Permission denied")
LIBRARY_NOISE = ("Event loop is closed", "reading array index", "TensorStore")
_LOGGERS = ("absl", "asyncio")


class OrbaxNoise(logging.Filter):
    MESSAGES = (
        "did not provide metrics",
        "setting save_interval_steps=0",
        "Given directory is read only",
        "Metadata file",  # a damaged _CHECKPOINT_METADATA: orbax reads the checkpoint without it
    )

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if any(text in message for text in self.MESSAGES):
            return False
        if record.levelno < logging.ERROR or not ("/orbax/" in record.pathname or "never retrieved" in message):
            return True
        text = f"{message} {record.exc_info[1] if record.exc_info else ''}"
        return not any(phrase in text for phrase in (*STORAGE_FAILURES, *LIBRARY_NOISE))


def is_noise(error) -> bool:
    return any(text in str(error) for text in LIBRARY_NOISE)


def install() -> None:
    """The log filters and the traceback hooks above, once per process."""
    if getattr(sys.unraisablehook, "rank4jax_quiet", False):
        return
    for name in _LOGGERS:
        logging.getLogger(name).addFilter(OrbaxNoise())
    previous_unraisable, previous_except = sys.unraisablehook, sys.excepthook

    def unraisable(info):
        if not is_noise(info.exc_value):
            previous_unraisable(info)

    def excepthook(exc_type, exc_value, tb):
        if not is_noise(exc_value):
            previous_except(exc_type, exc_value, tb)

    unraisable.rank4jax_quiet = True
    sys.unraisablehook, sys.excepthook = unraisable, excepthook
