"""User-facing errors: every problem caused by user input (a file, a config value, a checkpoint) raises a
:class:`UserError` whose one message names the file, row or field at fault; the entry points print it
without a traceback. Anything else is a bug and keeps its traceback. Standard library only."""

import errno
import logging
import os
import re
import sys


class UserError(Exception):
    """A problem with the user's input, reported as one clear message."""


class ConfigError(UserError, ValueError):
    """An invalid configuration value (names the field)."""


class DataError(UserError, ValueError):
    """A missing or malformed data file, or a token id outside the vocabulary."""


class CheckpointError(UserError):
    """A checkpoint that cannot be used with this run (missing, or from another config)."""


class WorkdirError(UserError):
    """A workdir that cannot be written (read-only, not a directory, a link, another run's lock)."""


class TrainingDivergedError(UserError):
    """The loss or gradient norm became NaN or infinite."""


class StageInterrupted(Exception):
    """A training run stopped by SIGTERM after saving its checkpoint: the command (and an experiment's
    later stages) stops there, status 143 (128 + SIGTERM)."""

    status = 143


# the storage faults a failed save is reported as: no space, quota, read-only, permission
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})
TENSORSTORE_ERRNO = re.compile(r"\[os_error_code='(\d+)'\]")  # how TensorStore's errors carry the errno


def storage_fault(error: BaseException | None) -> OSError | None:
    """The first OSError with a ``STORAGE_ERRNOS`` errno in ``error``'s cause/context chain (or the errno a
    TensorStore error there carries, ``[os_error_code='28']``); None for any other error."""
    seen = set()
    while error is not None and id(error) not in seen:
        code = TENSORSTORE_ERRNO.search(str(error))
        if isinstance(error, OSError) and error.errno in STORAGE_ERRNOS:
            return error
        if code and int(code.group(1)) in STORAGE_ERRNOS:
            return OSError(int(code.group(1)), os.strerror(int(code.group(1))))
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


class StorageFaultsSaidOnce(logging.Filter):
    """A command's filter on the absl and asyncio loggers: orbax's writer threads log a disk that fills
    during a save with a traceback each (hundreds of lines); the save's own error says it in one line."""

    def filter(self, record) -> bool:
        return storage_fault(record.exc_info[1] if record.exc_info else None) is None


def say(line: str) -> None:
    """One message to stderr in a single write, flushed; control characters (a crafted path's terminal
    escape sequences) shown as escapes, the message's own line breaks kept."""
    sys.stderr.write("\n".join(terminal_safe(part) for part in line.split("\n")) + "\n")
    sys.stderr.flush()


def terminal_safe(text: str) -> str:
    """``text`` with its control characters shown as escapes instead of reaching the terminal raw."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
