"""Log filters for what orbax and asyncio log about situations this project handles or reports itself,
installed by every command line (``cli.parse_flags``) on the named loggers they log through, never on
import and never by the library: a notebook or a test sees the libraries' logs as they are.

Filtered (``LibraryLogFilter``): orbax's warnings about what this project does on purpose (a
preemption save without a validation loss), about the optional
step metadata file, which orbax does without, or about reaching the preemption sync point of a
multi-process run (the run says at which step it saved); its error logs and asyncio's "Task exception was never
retrieved" about a failed save whose cause is a storage fault (a full disk, a quota, a read-only or
forbidden directory: reported in one line by ``checkpoint.storage.storage_error``), or about the reads
of the other arrays of a checkpoint whose first failed read rank4jax reports as damage.

No exception hook is installed anywhere. orbax's abandoned coroutines after a failed restore or save are closed
where the failure is handled (``checkpoint.storage.close_abandoned_coroutines``); any other traceback a
library prints from one of its threads or a finalizer (TensorStore's callbacks finding asyncio's
loop closed) is left as the library prints it.
"""

from __future__ import annotations

import errno
import logging
import os
import re

# the storage faults a failed save is reported as (checkpoint.storage.storage_error), by errno
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})
_LOGGERS = ("absl", "asyncio")


TENSORSTORE_ERRNO = re.compile(r"\[os_error_code='(\d+)'\]")  # how TensorStore's errors carry the errno


def storage_fault(error: BaseException | None) -> OSError | None:
    """The storage fault behind a library exception: the first OSError of its cause/context chain
    whose errno is one of ``STORAGE_ERRNOS`` (no space, quota, read-only, permission), or the errno a
    TensorStore error of the chain carries (its ``[os_error_code='28']``); None for any other."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OSError) and error.errno in STORAGE_ERRNOS:
            return error
        code = TENSORSTORE_ERRNO.search(str(error))
        if code and int(code.group(1)) in STORAGE_ERRNOS:
            return OSError(int(code.group(1)), os.strerror(int(code.group(1))))
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


class LibraryLogFilter(logging.Filter):
    """Drops orbax's and asyncio's records about what rank4jax does on purpose or reports itself."""

    MESSAGES = (
        "did not provide metrics",
        "Metadata file",  # a damaged _CHECKPOINT_METADATA: orbax reads the checkpoint without it
        "Reached preemption sync point",  # a multi-process SIGTERM: the run says where it saved
    )

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if any(text in message for text in self.MESSAGES):
            return False
        if record.levelno < logging.ERROR or not ("/orbax/" in record.pathname or "never retrieved" in message):
            return True
        error = record.exc_info[1] if record.exc_info else None
        return not (storage_fault(error) is not None or _from_orbax(error) or _checkpoint_read(error))


def _checkpoint_read(error: BaseException | None) -> bool:
    """A TensorStore read of a checkpoint's OCDBT database (orbax's format) that failed beside the one
    rank4jax reports: TensorStore sets it on an asyncio future from C++, with no Python frame to tell
    its origin by, so its message names the database."""
    return isinstance(error, ValueError) and "in OCDBT database at" in str(error)


def _from_orbax(error: BaseException | None) -> bool:
    """Whether an exception was raised in orbax's code (its traceback passes through it): a read or write
    of one array, failing beside the one whose failure rank4jax reports (a damaged checkpoint, a failed
    save), logged by asyncio as "exception was never retrieved"."""
    tb = error.__traceback__ if error is not None else None
    while tb is not None:
        if "/orbax/" in tb.tb_frame.f_code.co_filename:
            return True
        tb = tb.tb_next
    return False


def install_log_filters() -> None:
    """The filter on each named logger, once per process."""
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, LibraryLogFilter) for f in logger.filters):
            logger.addFilter(LibraryLogFilter())
