"""User-facing errors.

Every problem caused by user input (a file, a config value, a checkpoint) raises a subclass of
:class:`UserError` with one message that names the file, row or field at fault. The command-line
entry points print that message and exit non-zero without a stack trace; anything else is a bug
and keeps its traceback.
"""

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
    """A workdir that cannot be written (read-only, no permission, not a directory)."""


class WorkdirBusyError(UserError):
    """Another live process holds the workdir's lock (one training run per workdir)."""


class TrainingDivergedError(UserError):
    """The loss or gradient norm became NaN or infinite."""


class StageInterrupted(Exception):
    """A training run stopped by SIGTERM after saving its checkpoint (or, complete, after one while it
    finished): the command stops there (an experiment does not go on to its next stage), status 143."""

    status = 143  # 128 + SIGTERM, as a shell reports it


class RecompilationError(RuntimeError):
    """A jitted step compiled for more batch shapes than its layout can produce (a bug, not user input)."""


def say(line: str) -> None:
    """Write one message line to stderr in a single call and flush it (``print`` writes the text and
    its newline separately: a signal between the two glued the next message onto the line). Control
    characters (a crafted path's or file's terminal escape sequences) are shown as escapes; the line
    breaks a message is made of are kept."""
    safe = "\n".join(terminal_safe(part) for part in line.split("\n"))
    sys.stderr.write(f"{safe}\n")
    sys.stderr.flush()


def terminal_safe(text: str) -> str:
    """``text`` with its control characters shown as escapes instead of reaching the terminal raw."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
