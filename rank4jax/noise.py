"""A log filter for the records orbax logs about what this project does on purpose, installed by every
command line (``cli.parse_flags``) on the logger orbax logs through, never on import and never by the
library: a notebook or a test sees the libraries' logs as they are.

It drops only the records whose message names one of ``LibraryLogFilter.MESSAGES``: orbax's notice
that a multi-process run reached its preemption sync point (the run says at which step it saved).
Anything else a library logs, a storage fault or a damaged file among it, is left as it is: the
project's own line about the same fault comes after it.
"""

from __future__ import annotations

import logging

_LOGGERS = ("absl",)


class LibraryLogFilter(logging.Filter):
    """Drops the records whose message holds one of ``MESSAGES``."""

    MESSAGES = ("Reached preemption sync point",)  # a multi-process SIGTERM: the run says where it saved

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(text in message for text in self.MESSAGES)


def install_log_filters() -> None:
    """The filter on each named logger, once per process."""
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, LibraryLogFilter) for f in logger.filters):
            logger.addFilter(LibraryLogFilter())
