"""Ctrl-C in a command line, at points where it is safe. A KeyboardInterrupt raised at an arbitrary
instruction can land inside an extension module's import or a Python callback JAX's C++ code makes
(compiling, collecting garbage), where it crashes the process or is only printed; so while a command
runs (``noted``) a Ctrl-C is noted, and raised as Python's own KeyboardInterrupt at the next
:func:`check`: the training loop's steps, the evaluation's batches, the end of a command's imports or
of its work. Used from Python (a notebook, a test), nothing is installed: Ctrl-C is Python's, as
always. Standard library only."""

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
    """Around a command's imports and flag definitions (and the libraries its main imports first): a
    Ctrl-C while they run is one line and status 130 once they are done."""
    with noted():
        yield
    if _noted:
        _noted.clear()
        sys.stderr.write(STARTING + "\n")
        sys.exit(130)
