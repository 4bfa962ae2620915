"""The first statement of every command line: SIGINT/SIGTERM while the libraries import (seconds,
before the command installs handlers of its own) become one ``stopped:`` line and the signal's exit
status (130/143), never a ``KeyboardInterrupt`` traceback. Imports nothing but the standard library
(``rank4jax/__init__.py`` loads the model on first use only), so it is in force from the start."""

import os
import signal


def exit_on_signals(line: str) -> None:
    """From now on SIGINT/SIGTERM write ``stopped: <SIGNAL> <line>`` and exit at once with 128 + the
    signal (``os._exit``: the libraries' threads may be running; nothing is left to save)."""

    def stop(signum, frame):
        os.write(2, f"stopped: {signal.Signals(signum).name} {line}\n".encode())
        os._exit(128 + signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
