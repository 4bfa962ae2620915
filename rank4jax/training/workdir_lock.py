"""One writer per workdir: an advisory lock held for a training run's lifetime.

``train`` takes ``<workdir>/.lock`` with ``fcntl.flock`` (exclusive, non-blocking) before it reads or
writes anything there, and writes who holds it (pid, host, command, start time) into the file. A
second ``train.py`` on the same workdir is refused with one line naming the holder. The kernel drops
the lock when its process ends, however it ends (``kill -9`` included), so a lock file left by a dead
process is taken over by the next run: stale locks need no clean-up and cannot block anyone. Readers
(``eval.py``) take no lock; they pin a checkpoint step instead (``rank4jax.evaluation.report``).

In a multi-process run only process 0 takes the lock (the processes share the workdir). The lock is
advisory and local: it guards against two runs on one machine or one POSIX filesystem, not a workdir
on a filesystem without ``flock`` (then the lock is skipped with a warning).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import time

from rank4jax import files
from rank4jax.errors import WorkdirBusyError, WorkdirError, say
from rank4jax.records import LOCK_FILE


def _holder(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            info = json.load(f)
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["started"]))
        return f"pid {info['pid']} on {info['host']} ({info['command']}, since {since})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process (no holder recorded yet)"


class UndoIfFailed:
    """For ``ExitStack.push`` before the lock is taken: if the run fails (a refusal before training,
    say), what the run created and left empty is removed after the lock is released, so the workdir
    is as it was: the lock file, an empty ``dirs`` folder (checkpoints/), the workdir itself and the
    parents it made (an experiment's stage folder, ``d64/`` of ``d64/rank4``)."""

    def __init__(self, workdir: str, dirs: tuple[str, ...]):
        self.workdir, self.dirs, self.made = workdir, dirs, []
        path = os.path.abspath(workdir)
        while not os.path.lexists(path):  # the directories this run will create, innermost first
            self.made.append(path)
            path = os.path.dirname(path)
        if self.made == [] and not os.path.isdir(workdir):
            raise WorkdirError(f"the workdir {workdir} is a file, not a directory; nothing was changed")
        self.before = set() if self.made else set(os.listdir(workdir))

    def __call__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            return False
        created = [name for name in (*self.dirs, LOCK_FILE) if name not in self.before]
        for name in created:
            path = os.path.join(self.workdir, name)
            with contextlib.suppress(OSError):  # not empty (something was saved), or already gone
                os.rmdir(path) if os.path.isdir(path) else os.unlink(path)
        for path in self.made:
            try:
                os.rmdir(path)
            except OSError:  # not empty (or gone): what is above it stays too
                break
        return False  # the failure goes on


def make_workdir(workdir: str) -> None:
    """Create ``workdir`` (and its parents), or one WorkdirError naming why it cannot be."""
    files.make_dirs(workdir)
    if not os.access(workdir, os.W_OK | os.X_OK):
        raise WorkdirError(f"the workdir {workdir} is not writable; nothing was changed")


class WorkdirLock:
    """Context manager: the exclusive lock of ``workdir`` for this process, or WorkdirBusyError."""

    def __init__(self, workdir: str, enabled: bool = True):
        self.workdir, self.path = workdir, os.path.join(workdir, LOCK_FILE)
        self.enabled = enabled
        self._fd: int | None = None

    def __enter__(self):
        if not self.enabled:
            return self
        fd = files.open_own(self.workdir, LOCK_FILE, os.O_RDWR)  # a regular file of its own: no link, no FIFO
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise WorkdirBusyError(
                    f"{os.path.dirname(self.path) or '.'} is in use by {_holder(self.path)}; one training run "
                    "per workdir: wait for it to finish, stop it, or use another --workdir"
                ) from None
            if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                say(f"rank4jax: warning: cannot lock {self.path} ({e.strerror}); not guarded")
                return self
            raise
        self._fd = fd
        if os.fstat(fd).st_size:  # a holder that never released it: its process ended without cleaning up
            say(f"rank4jax: taking over the lock left by {_holder(self.path)}, which is no longer running")
        command = " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv)) or "python"
        info = {"pid": os.getpid(), "host": socket.gethostname(), "command": command, "started": time.time()}
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(info).encode(), 0)
        except OSError as e:  # a full disk, say: the run has written nothing else
            self.__exit__()
            raise WorkdirError(f"cannot write the lock file {self.path}: {e.strerror}; nothing was changed") from None
        return self

    def check(self, step: int) -> None:
        """Before writing step ``step``: the lock file must still be the one this run locked. Removed or
        replaced (``rm .lock`` after a refusal), it no longer keeps a second run out, so this one stops
        without writing, in one line."""
        if self._fd is None:
            return
        try:
            same = os.stat(self.path).st_ino == os.fstat(self._fd).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            raise WorkdirError(
                f"the lock file {self.path} was removed or replaced while this run held it, so another run "
                f"may be writing this workdir: stopped without saving step {step}; the checkpoints already "
                "saved are intact. Run one training per workdir."
            )

    def __exit__(self, *exc):
        if self._fd is not None:
            os.ftruncate(self._fd, 0)  # no holder: the file stays (removing it would race a new locker)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
