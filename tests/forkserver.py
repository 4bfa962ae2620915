"""The tests' command-line processes, forked from one Python that has already imported what every
command imports (``tests/launcher.py`` starts one per test worker and talks to it).

A fresh ``python train.py`` spends 2–3 s of CPU importing jax, flax, optax, orbax, grain and the
library before it reads its first flag; the suite starts about thirty. A child forked from this
server starts where those imports end and is otherwise a fresh process: its own pid, signal
dispositions, working directory, environment, argv, stdout and stderr (files), exit status, and the
interpreter's normal exit (``atexit``, finalisers). No backend is initialised here (checked), so
the children fork before XLA starts a thread. Tests of what happens *while* a command imports
start a real interpreter instead.

Protocol (one JSON object a line): the client writes ``{"argv", "cwd", "env", "stdout", "stderr"}``
(``stderr`` null: into stdout); the server answers ``{"pid": N}`` at once and ``{"exit": N,
"status": S}`` when that child ends (S as ``subprocess`` gives it: the exit code, or minus the
signal). End of input stops the server.
"""

import json
import os
import runpy
import select
import signal
import sys


def preimport() -> None:
    import absl.app  # noqa: F401
    import flax  # noqa: F401
    import grain  # noqa: F401
    import jax
    import matplotlib.pyplot  # noqa: F401
    import ml_collections.config_flags  # noqa: F401
    import optax  # noqa: F401
    import orbax.checkpoint  # noqa: F401
    from jax._src import xla_bridge

    import rank4jax.cli  # noqa: F401
    import rank4jax.evaluation.report  # noqa: F401
    import rank4jax.experiments.compare  # noqa: F401
    import rank4jax.training.loop  # noqa: F401

    assert not xla_bridge.backends_are_initialized(), "a backend started in the fork server"
    del jax


def _reply(message: dict) -> None:
    os.write(1, (json.dumps(message) + "\n").encode())


def _reap() -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _reply({"exit": pid, "status": os.waitstatus_to_exitcode(status)})


def serve() -> dict:
    """Answer requests until input ends (then exit); in a forked child, return its request."""
    wake_r, wake_w = os.pipe()
    for fd in (wake_r, wake_w):
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # the wakeup fd does the work
    pending = b""
    while True:
        ready, _, _ = select.select([0, wake_r], [], [])
        if wake_r in ready:
            while True:
                try:
                    if not os.read(wake_r, 512):
                        break
                except BlockingIOError:
                    break
            _reap()
        if 0 not in ready:
            continue
        chunk = os.read(0, 1 << 16)
        if not chunk:
            os._exit(0)
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                os.close(wake_r)
                os.close(wake_w)
                return request
            _reply({"pid": pid})


def become(request: dict) -> None:
    """Turn this forked child into the requested command (as ``python ARGV...`` would run it)."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 1)
    if request["stderr"] is None:  # stderr into stdout, as ``stderr=subprocess.STDOUT``
        os.dup2(1, 2)
    else:
        os.dup2(os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 2)
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", encoding="utf-8", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", encoding="utf-8", buffering=1, errors="backslashreplace", closefd=False)  # noqa: SIM115
    argv = request["argv"]
    if argv[0] == "-m":
        sys.argv = argv[1:]
        sys.path[0] = request["cwd"]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    preimport()
    become(serve())
