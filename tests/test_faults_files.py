"""The one writer (``rank4jax.files``): nothing a command writes under a workdir follows a symbolic or
hard link, or opens a FIFO, out of it; files are replaced atomically and created as the umask says;
experiments keep their runs in folders of their own."""

import json
import os
import shutil
import stat

import pytest

from rank4jax import files
from rank4jax.errors import ConfigError, WorkdirError
from rank4jax.evaluation.report import evaluate_run
from rank4jax.experiments.cloze_contexts import context_spread, write_spread
from rank4jax.experiments.runner import check_experiment_workdir, stage_dir
from rank4jax.training.loop import train
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
