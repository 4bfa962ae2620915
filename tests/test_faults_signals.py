"""One way to stop: Ctrl-C is Python's KeyboardInterrupt, said once at the command's entry point (the
checkpoint saved, status 130); SIGTERM stops the loop at the next step and saves through orbax (143).
No frame walking, no signal sent to oneself, no os._exit in the library. (SIGTERM to train.py and to a
two-process run: tests/test_preemption.py, tests/test_distributed.py.)"""

import json
import os
import pathlib
import re
import signal
import time

import pytest

from rank4jax.checkpoint import storage
from rank4jax.errors import StageInterrupted
from rank4jax.signals import STARTING
from rank4jax.training.loop import train
from tests import launcher
from tests.fault_helpers import TINY_FLAGS, _jaxlib_loaded, _start
from tests.helpers import tiny_config


@pytest.fixture
def python_ctrl_c():
    """Python's own Ctrl-C handler in this process, as an interactive session has it: a shell's
    background job starts with SIGINT ignored, which Python then leaves ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_during_eval_is_one_line_and_status_130(tiny_run_copy):
    """SIGINT to ``eval.py`` just after it has read the data (its warning about cut sentences is the
    sign: the evaluation's compiles and passes are still ahead): status 130 and one line, no
    traceback, no report."""
    proc = launcher.start("eval.py", f"--workdir={tiny_run_copy}", "--split=validation")
    deadline = time.monotonic() + 120
    while "warning:" not in proc.stderr_so_far():  # the tiny run's data always warns that sentences are cut
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    lines = [line for line in err.strip().splitlines() if "warning:" not in line]  # the data's own
    assert (proc.returncode, lines) == (130, ["stopped: Ctrl-C during the evaluation; no report was written"])
    assert "wrote" not in out, out


def test_ctrl_c_while_train_py_starts_is_one_line_and_status_130(tmp_path, monkeypatch):
    """SIGINT at two observed moments of ``train.py``'s start: while it imports (jaxlib's library is
    mapped into the process) and once the data is read and the state made (its model line is printed:
    the train step's compile is next). One ``stopped:`` line, status 130, no traceback, nothing left:
    the run unwound (its lock file and empty checkpoints/ removed)."""
    monkeypatch.setenv("PYTHONUNBUFFERED", "1")  # its model line as soon as it is printed
    for moment, expected in (("importing", STARTING), ("compiling", "stopped: Ctrl-C; no checkpoint was saved")):
        workdir = tmp_path / moment
        proc = _start(["train.py", f"--workdir={workdir}", *TINY_FLAGS], start_new_session=True)
        seen = ""
        if moment == "importing":
            while not _jaxlib_loaded(proc.pid):
                assert proc.poll() is None, proc.communicate()
                time.sleep(0.01)
        else:
            while "rank4jax: rank4 model" not in seen:
                line = proc.stdout.readline()
                assert line, f"train.py ended before its model line: {proc.communicate()}"
                seen += line
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, (moment, proc.returncode, err)
        lines = [line for line in err.strip().splitlines() if "warning:" not in line]  # the data's own
        assert lines == [expected], err
        assert not (workdir / "checkpoints").is_dir() and not (workdir / ".lock").exists()


def test_an_experiments_body_ends_in_one_line(tmp_path):
    """``run_experiment`` (every experiment command's body) in a real process: a Ctrl-C while it sets up,
    trains or evaluates is one line with the resume hint and 130; a user error one line and 2; SIGTERM
    outside a training loop is the default action (killed, no line, no traceback)."""
    script = tmp_path / "experiment.py"
    script.write_text(
        "import os, signal, sys, time\n"
        "from rank4jax.cli import run_experiment\n"
        "from rank4jax.errors import ConfigError\n"
        "def body():\n"
        "    if sys.argv[1] == 'error':\n"
        "        raise ConfigError('--ks must each be at least 1, got 0')\n"
        "    signal.raise_signal(signal.SIGINT if sys.argv[1] == 'ctrl_c' else signal.SIGTERM)\n"
        "    time.sleep(0.2)  # a noted Ctrl-C stops the command once its body returns\n"
        "run_experiment('ladder', body)\n"
    )
    ctrl_c, error, term = (launcher.run(str(script), moment, timeout=60) for moment in ("ctrl_c", "error", "term"))
    assert (ctrl_c.returncode, ctrl_c.stderr) == (
        130,
        "stopped: Ctrl-C during the ladder; rerun the same command to resume (finished runs are kept)\n",
    )
    assert (error.returncode, error.stderr) == (2, "error: --ks must each be at least 1, got 0\n")
    assert (term.returncode, term.stderr) == (-signal.SIGTERM, "")


@pytest.mark.parametrize("script", ["eval.py", "ladder.py"])  # every command's first lines are the same
def test_ctrl_c_while_a_command_imports_is_one_line_and_130(script, tmp_path):
    proc = _start([script, f"--workdir={tmp_path}"])
    while not _jaxlib_loaded(proc.pid):  # its first statement has run: the libraries are importing
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out, err) == (130, "", STARTING + "\n")


def test_sigterm_while_a_run_starts_or_finishes_and_ctrl_c_while_it_compiles(tmp_path, monkeypatch, python_ctrl_c):
    """SIGTERM while compiling (before the loop): the first step is saved and the run stops there;
    SIGTERM while the summary is written: the summary and curves complete, then StageInterrupted (an
    experiment goes on to no next stage); Ctrl-C while compiling: KeyboardInterrupt, the run unwound
    (no lock file, no checkpoints/)."""
    import rank4jax.training.loop as loop

    compile_first, write_summary = loop._compile_on_first_batch, loop.write_summary

    def signalled(signum, function):
        def call(*args):
            signal.raise_signal(signum)
            return function(*args)

        return call

    monkeypatch.setattr(loop, "_compile_on_first_batch", signalled(signal.SIGTERM, compile_first))
    workdir = tmp_path / "run"
    summary = train(tiny_config(), str(workdir))
    assert (summary["step"], summary["interrupted"]) == (1, "SIGTERM")
    assert sorted(os.listdir(workdir / "checkpoints")) == ["1"]
    monkeypatch.setattr(loop, "_compile_on_first_batch", compile_first)
    monkeypatch.setattr(loop, "write_summary", signalled(signal.SIGTERM, write_summary))
    with pytest.raises(StageInterrupted) as caught:  # complete, then the command stops (no next stage)
        train(tiny_config(plots=True), str(workdir))
    assert str(caught.value) == f"SIGTERM after training had ended; {workdir} is complete at step 6"
    assert caught.value.status == 143
    assert json.load(open(workdir / "train_summary.json"))["step"] == 6 and (workdir / "plots" / "curves.png").is_file()
    monkeypatch.setattr(loop, "write_summary", write_summary)
    assert train(tiny_config(plots=True), str(workdir))["step"] == 6  # rerun: complete, nothing to do
    monkeypatch.setattr(loop, "_compile_on_first_batch", signalled(signal.SIGINT, compile_first))
    fresh = tmp_path / "fresh"
    with pytest.raises(KeyboardInterrupt):
        train(tiny_config(), str(fresh))
    assert os.listdir(fresh) == ["config.json"]  # unwound: no lock file, no checkpoints/


def test_ctrl_c_while_the_last_save_finishes_leaves_it_whole(tiny_run_copy, monkeypatch, python_ctrl_c):
    """A Ctrl-C while the final save is written: KeyboardInterrupt, and the save finishes as the run
    unwinds (checkpoint 8 complete). Before its first save a run never waits on orbax: a Ctrl-C while
    it started could land in orbax's wait, which logged it as a failed save above the run's own line."""
    real, armed = storage.RunCheckpoints.wait_until_finished, []
    manager_calls = []

    def recorded(name):
        method = getattr(storage.ocp.CheckpointManager, name)

        def call(self, *args, **kwargs):
            manager_calls.append(name)
            return method(self, *args, **kwargs)

        return call

    for name in ("save", "wait_until_finished"):
        monkeypatch.setattr(storage.ocp.CheckpointManager, name, recorded(name))

    def signal_once(self):
        if armed and armed.pop():
            signal.raise_signal(signal.SIGINT)
        return real(self)

    monkeypatch.setattr(storage.RunCheckpoints, "wait_until_finished", signal_once)
    hook = lambda step, state: armed.append(step == 8)  # noqa: E731 -- the final step's save is next
    with pytest.raises(KeyboardInterrupt):
        train(tiny_config(num_steps=8), str(tiny_run_copy), hooks=[hook])
    assert manager_calls[0] == "save", manager_calls  # the resumed run's start waited on nothing
    with storage.RunCheckpoints(str(tiny_run_copy), read_only=True) as ckpt:
        assert ckpt.latest_step() == 8  # saved whole


def test_the_library_leaves_signals_as_python_has_them():
    """No frame walking for the garbage collector's callbacks, no signal sent to oneself, no ``os._exit``
    anywhere in the library (the entry points' one line comes from ``rank4jax.cli.run_command``); a
    SIGINT and SIGTERM handlers only in ``rank4jax.signals`` (a command's Ctrl-C noted for its checks, the
    trainer's SIGTERM request)."""
    library = pathlib.Path(__file__).resolve().parents[1] / "rank4jax"
    handlers = {}
    for path in library.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        found = re.findall(r"gc\.callbacks|os\.kill\(os\.getpid\(\)|os\._exit\(|raise_signal", text)
        assert not found, (path, found)
        if "signal.signal(" in text:
            handlers[path.relative_to(library).as_posix()] = text.count("signal.signal(")
    assert handlers == {"signals.py": 4}
