"""The one writer (``rank4jax.files``): nothing a command writes under a workdir follows a symbolic or
hard link, or opens a FIFO, out of it; files are replaced atomically and created as the umask says;
experiments keep their runs in folders of their own."""

import json
import os
import re
import shutil
import signal
import stat
import time

import jax
import jax.numpy as jnp
import pytest

from rank4jax import files
from rank4jax.errors import (
    ConfigError,
    DataError,
    WorkdirError,
)
from rank4jax.evaluation.report import evaluate_run
from rank4jax.experiments.cloze_contexts import context_spread, write_spread
from rank4jax.experiments.runner import check_experiment_workdir, stage_dir
from rank4jax.training import workdir_lock
from rank4jax.training.loop import train
from tests import launcher
from tests.fault_helpers import TINY_FLAGS, _holder_pid
from tests.helpers import tiny_config

CLOZE_HEADER = "InputSentence1,InputSentence2,InputSentence3,InputSentence4,RandomFifthSentenceQuiz1,"
CLOZE_HEADER += "RandomFifthSentenceQuiz2,AnswerRightEnding\n"


def test_the_writer_refuses_links_and_other_files_at_every_component(tmp_path):
    """A symbolic link as the file or as a folder on its way, a hard link, a FIFO or a folder where the
    file goes: one WorkdirError each, and the link's target unchanged."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    work = tmp_path / "work"
    (work / "eval").mkdir(parents=True)
    cases = {
        "a.json": lambda p: p.symlink_to(victim),
        "b.json": lambda p: os.link(victim, p),
        "c.json": lambda p: os.mkfifo(p),
        "d.json": lambda p: p.mkdir(),
        "linked/e.json": lambda p: p.parent.symlink_to(tmp_path),
    }
    for name, plant in cases.items():
        plant(work / name)
        with pytest.raises(WorkdirError, match="nothing was changed"):
            files.write_json(str(work), name, {"x": 1})
        with pytest.raises(WorkdirError):
            files.append_line(str(work), name, "{}")
        with pytest.raises(WorkdirError):
            files.open_own(str(work), name, os.O_RDWR)
    assert victim.read_text() == "precious" and os.stat(victim).st_nlink == 2  # b.json still shares it
    assert not (tmp_path / "e.json").exists()
    with pytest.raises(WorkdirError, match="is not below the workdir"):
        files.write_text(str(work), "../outside.txt", "x")


def test_files_are_replaced_whole_and_take_the_umask(tmp_path):
    """Each write replaces the file by a new one (no temporary left), created 0644 under umask 022, as the
    checkpoints and event files are (configs and reports were 0600)."""
    old = os.umask(0o022)
    try:
        path = files.write_json(str(tmp_path), "eval/r.json", {"a": 1})
        files.write_json(str(tmp_path), "eval/r.json", {"a": 2})
        files.append_line(str(tmp_path), "metrics.jsonl", "{}")
    finally:
        os.umask(old)
    assert json.load(open(path)) == {"a": 2} and os.listdir(tmp_path / "eval") == ["r.json"]
    for name in ("eval/r.json", "metrics.jsonl"):
        assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == 0o644
    assert stat.S_IMODE(os.stat(tmp_path / "eval").st_mode) == 0o755


def _snapshot(root) -> dict:
    """{relative path: (inode, mtime_ns, size)} of every file under ``root``."""
    out = {}
    for folder, _, names in os.walk(root):
        for name in names:
            info = os.lstat(os.path.join(folder, name))
            out[os.path.relpath(os.path.join(folder, name), root)] = (info.st_ino, info.st_mtime_ns, info.st_size)
    return out


def _written(before: dict, after: dict) -> list[str]:
    """The files a command wrote (new or replaced), leaving out orbax's own checkpoint files and the event
    files (a new name each time, in the workdir the writer checks)."""
    changed = [p for p, v in after.items() if before.get(p) != v]
    return sorted(p for p in changed if not p.startswith("checkpoints" + os.sep) and "tfevents" not in p)


def _refused_report(report: dict) -> dict:
    """eval's report, which it prints when it cannot write it (eval.py then exits 1): its error raised."""
    if report.get("write_error"):
        raise WorkdirError(report["write_error"])
    return report


def test_every_file_a_run_writes_refuses_a_planted_link(tiny_run, tmp_path):
    """The files a tiny train (resumed), eval and cloze_contexts run write, read from the run itself; in
    a copy, a symbolic link at each (then, in another copy, a hard link) to a file outside: each command
    is refused in one WorkdirError and every target is unchanged."""
    cloze = tmp_path / "cloze.csv"
    names = ["Ann", "Bob", "Cid", "Dee", "Eve", "Fay"]
    cloze.write_text(CLOZE_HEADER + "".join(f"{n} sat.,{n} ate.,{n} ran.,{n} slept.,{n} woke.,{n} flew.,1\n"
                                            for n in names), encoding="utf-8")  # fmt: skip
    commands = {
        "train": lambda w: train(tiny_config(num_steps=8, plots=True), w),
        "eval": lambda w: _refused_report(evaluate_run(w, split="validation", num_examples=0, rollout_steps=0)),
        "cloze_contexts": lambda w: write_spread(w, context_spread(w, str(cloze), pool=4, ks=(2,), draws=2)),
    }
    reference = tmp_path / "reference"
    shutil.copytree(tiny_run, reference)
    writes = {}
    for name, command in commands.items():
        before = _snapshot(reference)
        command(str(reference))
        writes[name] = _written(before, _snapshot(reference))
    assert {"config.json", "metrics.jsonl", "train_summary.json", os.path.join("plots", "curves.png")} <= set(
        writes["train"]
    )
    assert any(p.startswith("eval") for p in writes["eval"]) and len(writes["cloze_contexts"]) == 2
    for kind in ("symbolic", "hard"):
        for name, command in commands.items():
            copy = tmp_path / f"{kind}-{name}"
            shutil.copytree(reference, copy)
            victims = {}
            for n, path in enumerate(writes[name]):
                victim = tmp_path / f"victim-{kind}-{name}-{n}"
                victim.write_text(f"precious {n}")
                os.remove(copy / path)
                os.symlink(victim, copy / path) if kind == "symbolic" else os.link(victim, copy / path)
                victims[victim] = f"precious {n}"
            with pytest.raises(WorkdirError):
                command(str(copy))
            assert {str(v): v.read_text() for v in victims} == {str(v): t for v, t in victims.items()}, (kind, name)


def test_experiments_refuse_a_runs_workdir_and_linked_stage_folders(tiny_run, tmp_path):
    """compare and ladder keep their runs in folders of their own: a training run's workdir is refused
    (it trained inside the run), and a stage folder that is a link (it trained outside the workdir)."""
    with pytest.raises(ConfigError, match="is a training run's workdir"):
        check_experiment_workdir(str(tiny_run))
    work = tmp_path / "experiment"
    work.mkdir()
    (work / "d8").symlink_to(tmp_path)
    with pytest.raises(WorkdirError, match="d8 is a symbolic link"):
        stage_dir(str(work), "d8/rank4")
    assert stage_dir(str(work), "rank4") == str(work / "rank4") and not (work / "rank4").exists()


def test_a_second_writer_is_refused_and_a_dead_holders_lock_is_taken_over(tmp_path):
    """Two real train.py processes on one workdir: the second is refused with one line naming the
    first (pid, host, command), changes nothing and leaves the first running; after ``kill -9`` of
    the first its lock is taken over with a note."""
    workdir = str(tmp_path / "run")
    first = launcher.start("train.py", f"--workdir={workdir}", *TINY_FLAGS, "--config.num_steps=1000000")
    try:
        deadline = time.time() + 120
        metrics = os.path.join(workdir, "metrics.jsonl")  # training: every file it writes exists
        while _holder_pid(workdir) != first.pid or not os.path.isfile(metrics) or not os.path.getsize(metrics):
            assert first.poll() is None, first.communicate()[1][-2000:]
            assert time.time() < deadline, "the first run never started training"
            time.sleep(0.2)
        os.kill(first.pid, signal.SIGSTOP)  # paused, it still holds its lock, and leaves the CPU to the second
        before = sorted(os.listdir(workdir))
        second = launcher.start("train.py", f"--workdir={workdir}", *TINY_FLAGS, "--config.num_steps=4")
        _, err = second.communicate(timeout=120)
        assert second.returncode == 2 and "Traceback" not in err, err
        line = err.strip().splitlines()[-1]
        assert line.startswith(f"error: {workdir} is in use by pid {first.pid} on ") and "train.py" in line, line
        assert sorted(os.listdir(workdir)) == before  # the refused run wrote nothing (the holder is paused)
        os.kill(first.pid, signal.SIGCONT)
        assert first.poll() is None  # the holder carries on
    finally:
        first.kill()
        first.communicate()
    assert _holder_pid(workdir) == first.pid  # kill -9 leaves the file, but not the lock
    with workdir_lock.WorkdirLock(workdir):
        assert _holder_pid(workdir) == os.getpid()
        with pytest.raises(WorkdirError, match=f"pid {os.getpid()}"):  # held: even this process's
            with workdir_lock.WorkdirLock(workdir):  # second open file is refused
                pass
    assert os.path.getsize(os.path.join(workdir, workdir_lock.LOCK_FILE)) == 0  # released: no holder


def test_stale_lock_takeover_says_so(tmp_path, capsys):
    path = tmp_path / workdir_lock.LOCK_FILE
    path.write_text(json.dumps({"pid": 999999, "host": "elsewhere", "command": "train.py", "started": 0}))
    with workdir_lock.WorkdirLock(str(tmp_path)):
        pass
    assert "taking over the lock left by pid 999999 on elsewhere" in capsys.readouterr().err


def test_unwritable_workdir_is_one_error_before_any_work(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(WorkdirError, match="cannot create the workdir"):
        with workdir_lock.WorkdirLock(str(blocker / "run")):
            pass
    out = launcher.run("train.py", f"--workdir={blocker}/run", *TINY_FLAGS, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1] == f"error: cannot create the workdir {blocker}/run: Not a directory"


def test_read_only_workdir_is_one_error_before_any_work(tmp_path, monkeypatch):
    """A read-only filesystem (simulated: the tests may run as root, for whom chmod does not bite)."""
    import errno

    real_open = os.open

    def read_only(path, flags, *args):
        if str(path).endswith(workdir_lock.LOCK_FILE) and flags & os.O_CREAT:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
        return real_open(path, flags, *args)

    monkeypatch.setattr(workdir_lock.os, "open", read_only)
    with pytest.raises(WorkdirError, match=r"cannot write .*\.lock: Read-only file system; nothing"):
        train(tiny_config(), str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()  # nothing read, nothing written, nothing left


def test_a_refused_run_leaves_the_workdir_as_it_found_it(tmp_path):
    """A run refused during setup (here: a vocabulary of special tokens only) removes the lock file,
    the empty checkpoints/ and the workdir it created; a workdir that existed keeps what it held."""

    refused = tiny_config(**{"tokenizer.min_count": 10**6})
    new = tmp_path / "new" / "run"
    with pytest.raises(DataError):
        train(refused, str(new))
    assert sorted(os.listdir(tmp_path)) == []  # the workdir and the parent it made
    old = tmp_path / "old"
    old.mkdir()
    (old / "notes.txt").write_text("mine")
    with pytest.raises(DataError):
        train(refused, str(old))
    assert sorted(os.listdir(old)) == ["notes.txt"]


def test_a_symlinked_checkpoint_directory_is_refused_and_its_target_untouched(tiny_run_copy, tmp_path):
    """A crafted workdir whose checkpoints/ links to another run's: the resumed run wrote into that
    run and its keep policy deleted that run's checkpoints. Now one WorkdirError, nothing written."""
    other = tmp_path / "other"
    shutil.copytree(tiny_run_copy / "checkpoints", other)
    shutil.rmtree(tiny_run_copy / "checkpoints")
    os.symlink(other, tiny_run_copy / "checkpoints")
    before = sorted(os.listdir(other))
    config = tiny_config(num_steps=10)
    with pytest.raises(WorkdirError, match=f"checkpoints is a symbolic link \\(to {re.escape(str(other))}\\)"):
        train(config, str(tiny_run_copy))
    assert sorted(os.listdir(other)) == before


def test_nothing_a_run_writes_follows_a_link_out_of_its_workdir(tiny_run_copy, tmp_path):
    """A link planted in a workdir, where the run would write, is refused before anything is written
    (the link's target untouched); temporary files are made new beside their target, so a link named
    like one is never written through."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    workdir = tiny_run_copy
    for name in (".lock", "config.json", "metrics.jsonl", "train_summary.json", "plots", "checkpoints/4"):
        path = workdir / name
        moved = tmp_path / "moved"
        shutil.move(path, moved)
        path.symlink_to(victim)
        with pytest.raises(WorkdirError, match=f"{re.escape(str(path))} is a symbolic link .*nothing was changed"):
            train(tiny_config(num_steps=8), str(workdir))
        assert victim.read_text() == "precious", name
        path.unlink()
        shutil.move(moved, path)
    (workdir / "eval").symlink_to(tmp_path)
    with pytest.raises(WorkdirError, match="eval is a symbolic link"):
        evaluate_run(str(workdir), split="validation", num_examples=0, rollout_steps=0)
    (workdir / "eval").unlink()
    for name in ("config.json.tmp", "metrics.jsonl.tmp", "train_summary.json.tmp"):
        (workdir / name).symlink_to(victim)
    assert train(tiny_config(num_steps=8), str(workdir))["step"] == 8
    assert victim.read_text() == "precious" and not (workdir / "metrics.jsonl").is_symlink()


def test_eval_prints_its_figures_when_it_cannot_write_them(tiny_run_copy):
    (tiny_run_copy / "eval").write_text("a file where the reports directory would go")
    out = launcher.run("eval.py", f"--workdir={tiny_run_copy}", "--split=validation", "--rollout_steps=0", timeout=300)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    printed = json.loads(out.stdout[: out.stdout.index("}") + 1])  # the figures are printed: the evaluation's
    again = evaluate_run(str(tiny_run_copy), "validation", num_examples=0, rollout_steps=0)
    assert again["write_error"] and printed["window_ce"] == pytest.approx(again["window_ce"], rel=1e-6)
    assert out.stderr.strip().splitlines()[-1].startswith(f"error: {tiny_run_copy}/eval is not a directory")
    assert out.stderr.strip().endswith("the figures above were not saved")


def test_a_profile_that_cannot_be_written_leaves_nothing_behind(tmp_path, monkeypatch, capsys):
    """A trace whose writing fails (a full disk) was one warning, but its partial files stayed and took
    the space the next checkpoint needed; they are removed now, and training goes on."""
    from rank4jax.training.profiling import Profiler

    def failing_stop():
        partial = tmp_path / "profile" / "plugins" / "profile" / "2026_12_05_00_00_00"
        partial.mkdir(parents=True)
        (partial / "host.xplane.pb").write_bytes(b"x" * 100)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(jax.profiler, "start_trace", lambda *args, **kwargs: None)
    monkeypatch.setattr(jax.profiler, "stop_trace", failing_stop)
    profiler = Profiler(str(tmp_path), "2:3", say=lambda line: None)
    for step in (1, 2, 3):
        with profiler.step(step):
            pass
        profiler.step_done(step, jnp.zeros(()))
    assert os.listdir(tmp_path / "profile" / "plugins" / "profile") == []
    assert "the profile of steps 2-3 was not written" in capsys.readouterr().err
