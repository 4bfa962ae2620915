"""One writer per workdir: ``<workdir>/.lock``, ``fcntl.flock``-ed for a training run's lifetime and holding
who holds it; a second run is refused in one line naming the holder. The kernel drops the lock however its
process ends, so a dead holder's is taken over. Readers take none; only process 0 locks; on a filesystem
without ``flock`` it is skipped with a warning (docs/operations.md)."""

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
from rank4jax.errors import WorkdirError, say
from rank4jax.records import LOCK_FILE


def _holder(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            info = json.load(f)
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["started"]))
        return f"pid {info['pid']} on {info['host']} ({info['command']}, since {since})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process (no holder recorded yet)"


class WorkdirLock:
    """Context manager: creates ``workdir`` and takes its lock. A run that fails leaves the workdir as it
    was: what it made and left empty (the lock file, the ``undo`` folders, the workdir and its parents) is
    removed once the lock is released."""

    def __init__(self, workdir: str, enabled: bool = True, undo: tuple[str, ...] = ()):
        self.workdir, self.path, self.enabled, self.undo = workdir, os.path.join(workdir, LOCK_FILE), enabled, undo
        self._fd: int | None = None
        self.made, path = [], os.path.abspath(workdir)
        while not os.path.lexists(path):  # the directories this run creates, innermost first
            self.made.append(path)
            path = os.path.dirname(path)
        if not self.made and not os.path.isdir(workdir):
            raise WorkdirError(f"the workdir {workdir} is a file, not a directory; nothing was changed")
        self.before = set() if self.made else set(os.listdir(workdir))

    def __enter__(self):
        try:
            files.make_dirs(self.workdir)
            if not os.access(self.workdir, os.W_OK | os.X_OK):
                raise WorkdirError(f"the workdir {self.workdir} is not writable; nothing was changed")
            if self.enabled:
                self._lock()
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    def _lock(self) -> None:
        fd = files.open_own(self.workdir, LOCK_FILE, os.O_RDWR)  # a regular file of its own: no link, no FIFO
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise WorkdirError(
                    f"{self.workdir or '.'} is in use by {_holder(self.path)}; one training run per workdir: "
                    "wait for it to finish, stop it, or use another --workdir"
                ) from None
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            return say(f"rank4jax: warning: cannot lock {self.path} ({e.strerror}); not guarded")
        self._fd = fd
        if os.fstat(fd).st_size:  # a holder that never released it: its process ended without cleaning up
            say(f"rank4jax: taking over the lock left by {_holder(self.path)}, which is no longer running")
        command = " ".join([os.path.basename(sys.argv[0]), *sys.argv[1:]]) if sys.argv else "python"
        info = {"pid": os.getpid(), "host": socket.gethostname(), "command": command, "started": time.time()}
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(info).encode(), 0)
        except OSError as e:  # a full disk, say: the run has written nothing else
            raise WorkdirError(f"cannot write the lock file {self.path}: {e.strerror}; nothing was changed") from None

    def check(self, step: int) -> None:
        """Before writing step ``step``: the lock file must still be the one this run locked. Removed or
        replaced (``rm .lock`` after a refusal) it keeps no second run out, so this one stops unwritten."""
        if self._fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            if os.stat(self.path).st_ino == os.fstat(self._fd).st_ino:
                return
        raise WorkdirError(
            f"the lock file {self.path} was removed or replaced while this run held it, so another run may be "
            f"writing this workdir: stopped without saving step {step}; the checkpoints already saved are "
            "intact. Run one training per workdir."
        )

    def __exit__(self, exc_type=None, exc=None, tb=None):
        if self._fd is not None:
            os.ftruncate(self._fd, 0)  # no holder: the file stays (removing it would race a new locker)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        if exc_type is None or not self.enabled:
            return
        for name in (n for n in (*self.undo, LOCK_FILE) if n not in self.before):
            path = os.path.join(self.workdir, name)
            with contextlib.suppress(OSError):  # not empty (something was saved), or already gone
                os.rmdir(path) if os.path.isdir(path) else os.unlink(path)
        for path in self.made:
            try:
                os.rmdir(path)
            except OSError:  # not empty (or gone): what is above it stays too
                break
