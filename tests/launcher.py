"""Start the project's command lines as processes for the tests: ``run`` (like ``subprocess.run``) and
``start`` (a ``Proc``, like ``subprocess.Popen`` with stdout and stderr collected), each a real
process forked from this test worker's fork server (``tests/forkserver.py``), which has imported the
libraries once. Every command runs as a user runs it: one CPU device (``SUBPROCESS_XLA_FLAGS``), the
repository as working directory, ``python ARGV...`` semantics for scripts and ``-m`` modules.
"""

import atexit
import itertools
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time

from tests.conftest import REPO, SUBPROCESS_XLA_FLAGS


def command_env() -> dict:
    return dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=SUBPROCESS_XLA_FLAGS)


class _Server:
    def __init__(self):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.forkserver"],
            cwd=REPO,
            env=command_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.pending = b""
        self.exits: dict[int, int] = {}
        self.outputs = tempfile.mkdtemp(prefix="rank4jax-commands-")
        self.count = itertools.count()
        atexit.register(self.proc.stdin.close)  # end of input: the server exits

    def _read(self, timeout: float | None) -> dict | None:
        while b"\n" not in self.pending:
            ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
            if not ready:
                return None
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
            if not chunk:
                raise RuntimeError(f"the tests' fork server ended (status {self.proc.wait()})")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        message = json.loads(line)
        if "exit" in message:
            self.exits[message["exit"]] = message["status"]
        return message

    def spawn(self, argv: list[str], cwd: str, env: dict, merge: bool) -> tuple[int, str, str | None]:
        n = next(self.count)
        stdout, stderr = (os.path.join(self.outputs, f"{n}.{s}") for s in ("out", "err"))
        stderr = None if merge else stderr
        for path in (stdout, stderr):  # there before the child opens them: readable while it starts
            if path is not None:
                open(path, "w").close()
        request = {"argv": argv, "cwd": str(cwd), "env": env, "stdout": stdout, "stderr": stderr}
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        while True:
            message = self._read(None)
            if "pid" in message:
                return message["pid"], stdout, stderr

    def status(self, pid: int, timeout: float | None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while pid not in self.exits:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if self._read(left) is None:
                return None
        return self.exits[pid]


_SERVER: _Server | None = None


def _server() -> _Server:
    global _SERVER
    if _SERVER is None or _SERVER.proc.poll() is not None:
        _SERVER = _Server()
    return _SERVER


class Proc:
    """A started command: ``pid``, ``poll``, ``wait``, ``send_signal``, ``kill``, ``communicate``
    (its whole stdout and stderr once it has ended) and ``returncode``, as ``subprocess.Popen``;
    ``merge_stderr``: stderr written into stdout (``communicate`` gives None for it)."""

    def __init__(self, argv: list[str], cwd=REPO, env: dict | None = None, merge_stderr: bool = False):
        self.args = argv
        self.pid, self._stdout, self._stderr = _server().spawn(argv, cwd, env or command_env(), merge_stderr)
        self.returncode = None

    def poll(self) -> int | None:
        return self.wait(timeout=0.0, raise_on_timeout=False)

    def wait(self, timeout: float | None = None, raise_on_timeout: bool = True) -> int | None:
        if self.returncode is None:
            self.returncode = _server().status(self.pid, timeout)
            if self.returncode is None and raise_on_timeout:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def stderr_so_far(self) -> str:
        """What the command has written to stderr until now (a file: read again on every call)."""
        with open(self._stderr or self._stdout, encoding="utf-8", errors="backslashreplace") as f:
            return f.read()

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str, str | None]:
        try:
            self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        return _take(self._stdout), _take(self._stderr)


def _take(path: str | None) -> str | None:
    if path is None:
        return None
    with open(path, encoding="utf-8", errors="backslashreplace") as f:
        text = f.read()
    os.remove(path)
    return text


def start(*argv: str, cwd=REPO, env: dict | None = None, merge_stderr: bool = False) -> Proc:
    """``python ARGV...`` started (a script path or ``-m module`` first)."""
    return Proc(list(argv), cwd=cwd, env=env, merge_stderr=merge_stderr)


def run(*argv: str, cwd=REPO, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python ARGV...`` to its end: its status, stdout and stderr."""
    proc = start(*argv, cwd=cwd, env=env)
    stdout, stderr = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(list(argv), proc.returncode, stdout, stderr)
