"""What every command line does around its imports: a Ctrl-C while they run is noted, and once they
are done it is one line and status 130. (An extension module's import, jaxlib's, cannot be interrupted
by a ``KeyboardInterrupt``: it crashes.) Standard library only."""

import contextlib
import signal
import sys

STARTING = "stopped: Ctrl-C while starting; nothing was read or written"


@contextlib.contextmanager
def importing():
    """Around a command's imports and flag definitions (and the libraries its main imports first)."""
    noted = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: noted.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if noted:
        sys.stderr.write(STARTING + "\n")
        sys.exit(130)
