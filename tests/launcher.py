"""Start the project's command lines as processes for the tests: ``run`` (like ``subprocess.run``) and
``start`` (a ``Proc``, like ``subprocess.Popen`` with stdout and stderr collected), each a fresh
``python ARGV...`` (a script path or ``-m module``), as a user runs it: one CPU device
(``SUBPROCESS_XLA_FLAGS``), the repository as working directory. Only tests whose behaviour is the
process boundary start one (signals, locks, two processes, the command lines' one-line errors).
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import weakref

from tests.conftest import REPO, SUBPROCESS_XLA_FLAGS


def command_env() -> dict:
    return dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=SUBPROCESS_XLA_FLAGS)


class Proc:
    """A started command: ``pid``, ``poll``, ``wait``, ``send_signal``, ``kill``, ``communicate``
    (its whole stdout and stderr once it has ended) and ``returncode``, as ``subprocess.Popen``, whose
    process it is; its stdout and stderr go to files, so ``stderr_so_far`` reads them while it runs.
    ``merge_stderr``: stderr written into stdout (``communicate`` gives None for it)."""

    def __init__(self, argv: list[str], cwd=REPO, env: dict | None = None, merge_stderr: bool = False):
        self.args = argv
        outputs = tempfile.mkdtemp(prefix="rank4jax-command-")
        weakref.finalize(self, shutil.rmtree, outputs, ignore_errors=True)  # removed with this object
        self._stdout = os.path.join(outputs, "out")
        self._stderr = None if merge_stderr else os.path.join(outputs, "err")
        with open(self._stdout, "w") as out, open(self._stderr or os.devnull, "w") as err:
            self._popen = subprocess.Popen(
                [sys.executable, *argv],
                cwd=cwd,
                env=env or command_env(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT if merge_stderr else err,
            )
        self.pid = self._popen.pid

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    def poll(self) -> int | None:
        return self._popen.poll()

    def wait(self, timeout: float | None = None, raise_on_timeout: bool = True) -> int | None:
        try:
            return self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            if raise_on_timeout:
                raise
            return None

    def stderr_so_far(self) -> str:
        """What the command has written to stderr until now (a file: read again on every call)."""
        with open(self._stderr or self._stdout, encoding="utf-8", errors="backslashreplace") as f:
            return f.read()

    def send_signal(self, sig: int) -> None:
        if self._popen.returncode is None:
            self._popen.send_signal(sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str, str | None]:
        try:
            self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        return _read(self._stdout), _read(self._stderr)


def _read(path: str | None) -> str | None:
    if path is None:
        return None
    with open(path, encoding="utf-8", errors="backslashreplace") as f:
        return f.read()


def start(*argv: str, cwd=REPO, env: dict | None = None, merge_stderr: bool = False) -> Proc:
    """``python ARGV...`` started (a script path or ``-m module`` first)."""
    return Proc(list(argv), cwd=cwd, env=env, merge_stderr=merge_stderr)


def run(*argv: str, cwd=REPO, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python ARGV...`` to its end: its status, stdout and stderr."""
    proc = start(*argv, cwd=cwd, env=env)
    stdout, stderr = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(list(argv), proc.returncode, stdout, stderr)
