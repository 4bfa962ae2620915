"""Faults and hostile input: one writer per workdir, unwritable workdirs, damaged
checkpoints (evaluation and resume fall back to the newest readable one), a checkpoint deleted
while evaluation reads it, non-finite checkpoint values.

Each fault ends in one ``error:`` line that names its cause, with nothing already saved lost."""

import glob
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rank4jax.checkpoint import damage, storage
from rank4jax.checkpoint.damage import CheckpointDamaged
from rank4jax.errors import (
    CheckpointError,
    ConfigError,
    DataError,
    StageInterrupted,
    TrainingDivergedError,
    WorkdirBusyError,
    WorkdirError,
)
from rank4jax.evaluation.report import evaluate_run
from rank4jax.runs import describe_run, load_run, resolve_step
from rank4jax.training import output, workdir_lock
from rank4jax.training.loop import train
from tests import launcher
from tests.conftest import REPO, SUBPROCESS_XLA_FLAGS
from tests.helpers import free_port, tiny_config, tiny_flags

TINY_FLAGS = tiny_flags()  # the tiny run (tests/helpers.TINY) as command-line flags


def _start(args, **kwargs):
    """A fresh interpreter, for the tests that read its output as it comes or signal it while it imports."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=SUBPROCESS_XLA_FLAGS)
    return subprocess.Popen(
        [sys.executable, *args], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs
    )


def _jaxlib_loaded(pid) -> bool:
    """jaxlib's library is mapped into the process: it is importing the libraries."""
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8") as f:
            return "jaxlib" in f.read()
    except OSError:
        return False


def _holder_pid(workdir) -> int | None:
    try:
        with open(os.path.join(workdir, workdir_lock.LOCK_FILE), encoding="utf-8") as f:
            return json.load(f)["pid"]
    except (OSError, ValueError, KeyError):
        return None


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
        with pytest.raises(WorkdirBusyError, match=f"pid {os.getpid()}"):  # held: even this process's
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
        workdir_lock.make_workdir(str(blocker / "run"))
    out = launcher.run("train.py", f"--workdir={blocker}/run", *TINY_FLAGS, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1] == f"error: cannot create the workdir {blocker}/run: Not a directory"


DAMAGE = {  # what each does to a checkpoint's files (orbax's layout: the tests may know it, rank4jax does not)
    "truncated_arrays": lambda s: [_truncate(f) for f in glob.glob(f"{s}/*/ocdbt.process_0/d/*")],
    "missing_arrays": lambda s: [os.remove(f) for f in glob.glob(f"{s}/*/ocdbt.process_0/d/*")],
    "empty_config": lambda s: open(f"{s}/config/metadata", "w").close(),
    "empty_manifest": lambda s: [open(f, "w").close() for f in glob.glob(f"{s}/**/manifest.ocdbt", recursive=True)],
    "empty_array_metadata": lambda s: [open(f"{s}/{item}/_METADATA", "w").close() for item in ("params", "opt_state")],
    "missing_tokenizer": lambda s: shutil.rmtree(f"{s}/tokenizer"),
    "empty_step_dir": lambda s: (shutil.rmtree(s), os.makedirs(s)),
}


# A restore that fails on a damaged checkpoint abandons TensorStore's other reads; their callbacks may
# find orbax's event loop closed and print "Exception ignored" (a library's lines in a rare fault, which
# the product lets through with its own line about the checkpoint after them). Not this suite's output.
LIBRARY_LINES_OF_A_DAMAGED_READ = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def _truncate(path):  # to 16 bytes: every array's data is cut (half a file may still hold the parameters)
    with open(path, "r+b") as f:
        f.truncate(min(16, os.path.getsize(path)))


def _params(workdir, step):
    return load_run(str(workdir), step).params


def restore_state_numpy(workdir, step):
    """The whole train state of a checkpoint (with its own optimiser structure)."""
    with storage.RunCheckpoints(str(workdir), read_only=True) as ckpt:
        run = describe_run(ckpt, step)
        return ckpt.restore_state(step, run.abstract_state)


@LIBRARY_LINES_OF_A_DAMAGED_READ
@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_eval_falls_back_from_a_damaged_checkpoint_and_leaves_it(kind, tiny_run_copy, capsys):
    """Seven kinds of damage to the newest checkpoint (6): evaluation of 'latest' and 'best' warns,
    names checkpoint 6 as damaged (never a config mismatch) and reports checkpoint 4, leaving 6 in
    place; asked for by number, 6 is one error; the library's background read errors stay quiet."""
    step6 = tiny_run_copy / "checkpoints" / "6"
    before = sorted(p.name for p in step6.rglob("*"))
    DAMAGE[kind](str(step6))
    damaged_files = sorted(p.name for p in step6.rglob("*"))
    for which in ("latest", "best"):
        report = evaluate_run(str(tiny_run_copy), split="validation", step=which, num_examples=0, rollout_steps=0)
        assert report["step"] == 4
        err = capsys.readouterr().err
        assert "Traceback" not in err and "match" not in err and "bound method" not in err, err
        if kind == "empty_step_dir" and "checkpoint 6" not in err:  # a read-only manager does not list an
            continue  # empty step directory at all
        assert f"checkpoint 6 in {tiny_run_copy} is damaged and cannot be read" in err
        about_checkpoints = [line for line in err.strip().splitlines() if "are cut" not in line]  # not the data's
        assert len(about_checkpoints) == 1, err
    assert sorted(p.name for p in step6.rglob("*")) == damaged_files and (kind == "empty_step_dir" or before)
    with pytest.raises(CheckpointError, match="checkpoint 6 .* is damaged|no checkpoint at step 6"):
        evaluate_run(str(tiny_run_copy), split="validation", step=6, num_examples=0, rollout_steps=0)


def test_the_best_checkpoint_is_the_logged_validations_lowest_on_disk(tiny_run_copy, capsys):
    """The best step comes from the validations metrics.jsonl logs, among the checkpoints on disk:
    6 with its validation record gone is no candidate for best (4 is), and still restores."""
    path = tiny_run_copy / "metrics.jsonl"
    with storage.RunCheckpoints(str(tiny_run_copy), read_only=True) as ckpt:
        assert (ckpt.best_step(), ckpt.latest_step()) == (6, 6)
    lines = path.read_text().splitlines()
    path.write_text("\n".join(x for x in lines if not ('"validation"' in x and '"step": 6,' in x)) + "\n")
    with storage.RunCheckpoints(str(tiny_run_copy), read_only=True) as ckpt:
        assert (ckpt.best_step(), ckpt.latest_step(), ckpt.best_metric()[0]) == (4, 6, 4)
    report = evaluate_run(str(tiny_run_copy), split="validation", step="latest", num_examples=0, rollout_steps=0)
    assert report["step"] == 6
    path.unlink()  # no log at all: 'best' is the latest, said once
    with storage.RunCheckpoints(str(tiny_run_copy), read_only=True) as ckpt:
        assert resolve_step(ckpt, "best") == 6
    assert "no checkpoint in" in capsys.readouterr().err


def test_a_tensorstore_read_error_is_named_by_its_cause():
    """orbax wraps TensorStore's error in one that quotes a bound method's repr; the cause is named."""
    try:
        try:
            raise ValueError('OUT_OF_RANGE: Error reading "params.embed.sem/0"\nmore')
        except ValueError as e:
            raise Exception(
                "Encountered error while reading array index: 0. See full TensorStore details: <bound method>."
            ) from e
    except Exception as wrapped:
        assert damage.reason(wrapped) == 'ValueError: OUT_OF_RANGE: Error reading "params.embed.sem/0"'


@LIBRARY_LINES_OF_A_DAMAGED_READ
@pytest.mark.parametrize("kind", ["missing_arrays", "empty_config"])
def test_resume_falls_back_moves_the_damaged_checkpoint_aside_and_continues_exactly(
    kind, tiny_run, tiny_run_copy, capsys
):
    DAMAGE[kind](str(tiny_run_copy / "checkpoints" / "6"))
    summary = train(tiny_config(), str(tiny_run_copy))  # resumes from 4, trains 5 and 6 again
    err = capsys.readouterr().err
    assert "checkpoint 6" in err and "is damaged" in err and "Traceback" not in err
    assert summary["step"] == 6 and (tiny_run_copy / "damaged_checkpoints" / "6").is_dir()
    for a, b in zip(
        jax.tree_util.tree_leaves(_params(tiny_run_copy, 6)),
        jax.tree_util.tree_leaves(_params(tiny_run, 6)),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)  # the same step 6 as the uninterrupted run


@LIBRARY_LINES_OF_A_DAMAGED_READ
def test_no_readable_checkpoint_is_one_error_and_nothing_moves(tiny_run_copy):
    for step in (4, 6):
        DAMAGE["missing_arrays"](str(tiny_run_copy / "checkpoints" / str(step)))
    with pytest.raises(CheckpointError, match=r"no readable checkpoint in .*\(6: .*; 4: .*\); nothing was moved"):
        train(tiny_config(), str(tiny_run_copy))
    assert sorted(os.listdir(tiny_run_copy / "checkpoints")) == ["4", "6"]
    assert not (tiny_run_copy / "damaged_checkpoints").exists()


def test_eval_survives_the_step_being_deleted_while_it_reads(tiny_run_copy, monkeypatch, capsys):
    """A training run's keep policy deletes the step eval is reading: it takes the next one."""
    real = storage.RunCheckpoints.restore_params
    calls = []

    def deleting(self, step, abstract):
        calls.append(step)
        if len(calls) == 1:
            shutil.rmtree(os.path.join(self.workdir, "checkpoints", str(step)))
        return real(self, step, abstract)

    monkeypatch.setattr(storage.RunCheckpoints, "restore_params", deleting)
    report = evaluate_run(str(tiny_run_copy), split="validation", step="latest", num_examples=0, rollout_steps=0)
    assert calls == [6, 4] and report["step"] == 4
    assert "checkpoint 6 was removed while being read" in capsys.readouterr().err


def test_non_finite_values_are_damage_and_divergence_after_resume_blames_the_checkpoint():
    with pytest.raises(CheckpointDamaged, match="checkpoint 3 in w is damaged .*NaN or infinite"):
        damage.check_finite("w", 3, {"a": jnp.ones(2), "b": jnp.array([1.0, jnp.inf]), "i": jnp.arange(2)})
    damage.check_finite("w", 3, {"a": jnp.ones(2), "i": jnp.arange(2)})
    damage.check_finite("w", 3, {"i": jnp.arange(2)})  # nothing to check
    metric = {"loss": np.nan, "grad_norm": 1.0, "update_norm": 1.0, "param_norm": 1.0}
    metric |= {"last_slice_ce_sum": 0.0, "last_slice_tokens": 1.0}
    with pytest.raises(TrainingDivergedError, match="resuming from checkpoint 4: its optimiser state may be damaged"):
        output._train_record([metric, metric], 6, 0.0, 8, resumed_at=4)
    with pytest.raises(TrainingDivergedError, match="lower optim.learning_rate or set optim.grad_clip_norm"):
        output._train_record([metric, metric], 8, 0.0, 8, resumed_at=4)


def test_optimiser_settings_may_change_on_resume(tiny_run_copy, capsys):
    """Adding clipping and a warmup schedule on resume (what the divergence message advises): the
    run continues from its checkpoint with Adam's moments and step carried over."""
    saved = restore_state_numpy(tiny_run_copy, 6)
    listing = sorted(os.listdir(tiny_run_copy))
    with pytest.raises(CheckpointError, match=r"trained with batch_size=8: .* batch_size=16 would skip or repeat"):
        train(tiny_config(num_steps=8, batch_size=16), str(tiny_run_copy))  # refused before any work
    assert sorted(os.listdir(tiny_run_copy)) == listing
    config = tiny_config(num_steps=8, grad_accum_steps=2, **{"optim.grad_clip_norm": 1.0, "optim.warmup_steps": 3})
    seen = {}
    summary = train(
        config, str(tiny_run_copy), hooks=[lambda step, state: seen.setdefault(step, jax.device_get(state.opt_state))]
    )
    assert summary["step"] == 8 and sorted(seen) == [7, 8]
    err = capsys.readouterr().err
    assert "optimiser settings changed on resume (grad_clip_norm: 0.0 → 1.0; warmup_steps: 0 → 3)" in err
    assert "settings changed on resume: grad_accum_steps: 1 → 2; num_steps: 6 → 8; plots: True → False\n" in err
    clip, (adam, _, schedule) = seen[7]
    assert int(adam.count) == 7 and int(schedule.count) == 7  # one step after the carried 6 (fresh: 1)
    assert int(saved.opt_state[0].count) == 6 and any(np.any(x) for x in jax.tree_util.tree_leaves(saved.opt_state))
    assert all(np.all(np.isfinite(np.asarray(n))) for n in jax.tree_util.tree_leaves(adam.mu))
    # the carried values themselves: test_carry_optimizer_state_by_hand


def test_carry_optimizer_state_by_hand():
    from rank4jax.engine.state import carry_optimizer_state, make_optimizer

    params = {"w": jnp.ones(3)}
    base = tiny_config().optim
    old = make_optimizer(base).init(params)
    old = jax.tree_util.tree_map(lambda x: x, old)
    old_adam = old[0]._replace(count=jnp.asarray(5, jnp.int32), mu={"w": jnp.arange(3.0)}, nu={"w": jnp.full(3, 2.0)})
    old = (old_adam, *old[1:])
    changed = tiny_config(**{"optim.grad_clip_norm": 1.0, "optim.warmup_steps": 10}).optim
    new = carry_optimizer_state(old, make_optimizer(changed).init(params), jnp.asarray(5))
    _, (adam, _, schedule) = new
    np.testing.assert_array_equal(adam.mu["w"], [0.0, 1.0, 2.0])
    np.testing.assert_array_equal(adam.nu["w"], [2.0, 2.0, 2.0])
    assert int(adam.count) == 5 and int(schedule.count) == 5


ROC_HEADER = "storyid,storytitle,sentence1,sentence2,sentence3,sentence4,sentence5\r\n"
ROC_ROW = "s{i},Title,Anna went to the café.,She ordered tea.,It was hot.,She waited.,Then she drank it.\r\n"


def _roc_text(rows=3):
    return ROC_HEADER + "".join(ROC_ROW.format(i=i) for i in range(rows))


@pytest.mark.parametrize(
    "encoding", ["utf-8", "utf-8-sig", "cp1252", "utf-16"], ids=["utf8", "utf8_bom", "windows1252", "utf16_bom"]
)
def test_csv_files_as_spreadsheets_write_them_are_read(encoding, tmp_path, capsys):
    from rank4jax.data.readers import read_stories

    path = tmp_path / "stories.csv"
    path.write_bytes(_roc_text().encode(encoding))
    stories = read_stories(str(path))
    assert [s.story_id for s in stories] == ["s0", "s1", "s2"]
    assert stories[0].sentences[0] == "Anna went to the café." and stories[0].sentences[4] == "Then she drank it."
    err = capsys.readouterr().err
    assert ("read as Windows-1252 (detected)" in err) == (encoding == "cp1252")


BAD_FILES = {
    "json.json": (b'[{"story": "Anna went out."}]', "looks like JSON (detected from its name)"),
    "json.txt": (b'{"story": "Anna went out."}\n', "looks like JSON (detected from its first character)"),
    "sheet.csv": (b"PK\x03\x04" + bytes(200), "not a text file (detected: a zip archive (an .xlsx/.ods spreadsheet"),
    "data.bin": (b"Anna went out.\nShe came back.\n\x00\x01\x02" + bytes(range(256)) * 60, "a NUL byte on line 3"),
    "stories.gz": (b"\x1f\x8b\x08" + bytes(100), "gzip-compressed: decompress it first"),
    "mixed.txt": (b"Anna went out.\nShe \x81came back.\n", "line 2: neither UTF-8 nor Windows-1252 text (byte 0x81)"),
    # binary named .csv: read as a file, not as a header of mojibake ("unrecognised CSV header ['t3��']")
    "random.csv": (b"t3\xe9\xfe\xe2,\n\x04" + bytes(range(256)) * 4, "a NUL byte on line 2"),
    "no_nul.csv": (
        b"t3\x9b\xe9\n" + bytes(range(1, 256)) * 4,
        "line 1: neither UTF-8 nor Windows-1252 text (byte 0x9b)",
    ),
    "control.csv": (b"\x01\x02\x03,\x04\n", "not a text file (detected: unprintable characters in its first line)"),
    "empty.csv": (b"", "the file is empty"),
    "empty.txt": (b"", "the file is empty"),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_files_that_are_not_stories_are_one_short_line(name, tmp_path):
    from rank4jax.data.readers import read_stories
    from rank4jax.errors import DataError

    content, message = BAD_FILES[name]
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(DataError) as caught:
        read_stories(str(path))
    text = str(caught.value)
    assert text.startswith(f"{path}: ") and message in text and len(text) < 300 and "\n" not in text, text


def test_degenerate_data_is_counted_warned_about_or_refused(tmp_path, capsys):
    """A vocabulary of only the special tokens is an error; cut sentences, unknown tokens and
    duplicate story ids are counted in the data summary and warned about when large."""
    from rank4jax.engine.data_setup import prepare_data, prepare_split
    from rank4jax.errors import DataError

    with pytest.raises(DataError, match=r"has 0 token\(s\) besides PAD/UNK/BOS/EOS .*lower tokenizer.min_count"):
        prepare_data(tiny_config(**{"tokenizer.min_count": 10**6}))
    rows = [ROC_ROW.format(i=i % 30) for i in range(40)]  # 40 stories, 10 repeat an id
    rows += [f"u{i},T,Zyx{i} qwv{i} went.,Kjh{i} sat.,Pqr{i} ran.,Wvu{i} hid.,Mno{i} slept.\r\n" for i in range(10)]
    path = tmp_path / "roc.csv"
    path.write_text(ROC_HEADER + "".join(rows), encoding="utf-8")
    config = tiny_config(**{"data.source": "file", "data.path": str(path), "model.n_tokens": 4})
    data = prepare_data(config)
    summary = data.summary()
    err = capsys.readouterr().err
    assert summary["duplicate_ids"] == 10 and "10 of 50 stories repeat an earlier story's id" in err
    # "Anna went to the café ." (6 tokens) and "Then she drank it ." (5) are cut to 4, in 40 stories
    assert summary["truncated_sentences"] == 80 and summary["truncated_fraction"] == round(80 / 250, 4)
    assert "80 of 250 sentences (32%) are longer than model.n_tokens=4 tokens and are cut" in err
    unknown = tmp_path / "unknown.txt"  # evaluation text made of words the vocabulary never saw
    unknown.write_text("Blorp zanged quix. Frel mop dax. Vin tor lek. Sar pim ox. Gup lat wex.\n", encoding="utf-8")
    held_out = prepare_split(config, data.tokenizer, "all", path=str(unknown))[1]
    assert held_out.unk_rate == 15 / 20  # the 15 words are UNK, the 5 full stops are known
    assert f"{unknown}: 75% of all the tokens are unknown to the vocabulary (UNK)" in capsys.readouterr().err


def test_a_full_disk_is_one_error_and_the_saved_checkpoints_stay(tmp_path, monkeypatch):
    import errno

    import orbax.checkpoint as ocp

    real = ocp.CheckpointManager.save

    def full_at_4(self, step, *args, **kwargs):
        if step == 4:
            raise RuntimeError("save failed") from OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, step, *args, **kwargs)

    monkeypatch.setattr(ocp.CheckpointManager, "save", full_at_4)
    workdir = str(tmp_path / "run")
    with pytest.raises(WorkdirError) as caught:
        train(tiny_config(), workdir)
    assert str(caught.value) == (
        f"cannot save checkpoint 4 in {workdir}: No space left on device; checkpoint 2 is intact"
    )
    monkeypatch.undo()  # space again: the run resumes from step 2 and finishes
    assert train(tiny_config(), workdir)["step"] == 6


def test_a_need_is_shown_rounded_up_and_free_space_down():
    assert [storage._size(n, up=True) for n in (1000, 1001, 999_001, 1_300_001, 2.5e9)] == [
        "1 KB", "2 KB", "1000 KB", "1.4 MB", "2.5 GB"
    ]  # fmt: skip
    assert [storage._size(n, up=False) for n in (1999, 1_399_999, 2.59e9)] == ["1 KB", "1.3 MB", "2.5 GB"]


def test_a_save_the_disk_cannot_hold_is_refused_before_it_is_written(tmp_path, monkeypatch):
    """A save needs SPACE_MARGIN times the state's bytes plus 1 MiB free; short of that it is one error
    naming both, and nothing of it is written."""
    answers = iter([10**12, 10**12, 1000])  # the start and the first save find room, the second 1 KB
    monkeypatch.setattr(storage, "free_bytes", lambda directory: next(answers))
    workdir = str(tmp_path / "run")
    with pytest.raises(WorkdirError) as caught:
        train(tiny_config(), workdir)
    state = load_run(workdir, 2)  # the state's bytes: the parameters and Adam's two moments, the step and key
    state_bytes = 3 * sum(np.asarray(x).nbytes for x in jax.tree.leaves(state.params)) + 4 + 8
    need = storage.SPACE_MARGIN * state_bytes + 2**20
    assert str(caught.value) == (
        f"cannot save checkpoint 4 in {workdir}: No space left on device "
        f"(it needs about {math.ceil(need / 1e5) / 10:.1f} MB, 1 KB free); checkpoint 2 is intact"
    )
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["2"]
    monkeypatch.setattr(storage, "free_bytes", lambda directory: 1000)  # not even the first fits
    with pytest.raises(WorkdirError, match=r"^cannot save checkpoint 2 in .*\(it needs about 1\.\d MB, 1 KB free\); "):
        train(tiny_config(), str(tmp_path / "other"))
    assert not os.path.exists(tmp_path / "other" / "checkpoints")  # orbax makes it at the first save
    monkeypatch.undo()  # space again: the run resumes from step 2 and finishes
    assert train(tiny_config(), workdir)["step"] == 6


def test_eval_prints_its_figures_when_it_cannot_write_them(tiny_run_copy):
    (tiny_run_copy / "eval").write_text("a file where the reports directory would go")
    out = launcher.run("eval.py", f"--workdir={tiny_run_copy}", "--split=validation", "--rollout_steps=0", timeout=300)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    printed = json.loads(out.stdout[: out.stdout.index("}") + 1])  # the figures are printed: the evaluation's
    again = evaluate_run(str(tiny_run_copy), "validation", num_examples=0, rollout_steps=0)
    assert again["write_error"] and printed["window_ce"] == pytest.approx(again["window_ce"], rel=1e-6)
    assert out.stderr.strip().splitlines()[-1].startswith(f"error: {tiny_run_copy}/eval is not a directory")
    assert out.stderr.strip().endswith("the figures above were not saved")


def test_a_message_line_is_one_write(monkeypatch):
    """Warnings and errors reach stderr text and newline together: ``print`` writes them separately,
    and a Ctrl-C handled between the two glued the stop line onto a cut-sentences warning (CI, once)."""
    from rank4jax.engine.data_setup import data_warnings

    class Split:  # what data_warnings reads of a split's windows
        n_sentences, n_truncated, unk_rate = 10, 5, 0.5

        def __len__(self):
            return 3

    writes = []

    class Recorder:
        def write(self, text):
            writes.append(text)
            return len(text)

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stderr", Recorder())
    data_warnings("stories.csv", {"train": Split()}, n_tokens=8, duplicates=2, n_stories=9)
    assert len(writes) == 3 and all(w.startswith("rank4jax: warning: stories.csv: ") for w in writes), writes
    assert all(w.endswith("\n") and w.count("\n") == 1 for w in writes), writes


def test_ctrl_c_during_eval_is_one_line_and_status_130(tiny_run_copy):
    """SIGINT to ``eval.py`` just after it has read the data (its warning about cut sentences is the
    sign: the evaluation's compiles and passes are still ahead): status 130 and one line, no
    traceback, no report. (SIGINT while it imports: the experiment commands' test below.)"""
    proc = launcher.start("eval.py", f"--workdir={tiny_run_copy}", "--split=validation")
    deadline = time.monotonic() + 120
    while "warning:" not in proc.stderr_so_far():  # the tiny run's data always warns that sentences are cut
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    lines = [line for line in err.strip().splitlines() if "warning:" not in line]  # the data's own
    assert (proc.returncode, lines) == (130, ["stopped: SIGINT during evaluation; no report was written after it"])
    assert "wrote" not in out, out


def test_ctrl_c_while_train_py_starts_is_one_line_and_status_130(tmp_path, monkeypatch):
    """SIGINT at two observed moments of ``train.py``'s start: while it imports (jaxlib's library is
    mapped into the process) and once the data is read and the state made (its model line is printed:
    the train step's compile is next). One ``stopped:`` line, status 130, no traceback, no checkpoint."""

    monkeypatch.setenv("PYTHONUNBUFFERED", "1")  # its model line as soon as it is printed
    for moment in ("importing", "compiling"):
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
        expected = "stopped: SIGINT outside the training loop; no checkpoint was being written"
        lines = [line for line in err.strip().splitlines() if "warning:" not in line]  # the data's own
        assert lines == [expected], err
        assert not (workdir / "checkpoints").is_dir() or not os.listdir(workdir / "checkpoints")


def test_a_model_too_large_for_memory_is_refused_before_allocating(tmp_path):
    from rank4jax.errors import ConfigError

    start = time.perf_counter()
    with pytest.raises(ConfigError, match=r"the model has [0-9,]{17,} parameters: .* GiB per device, more than the"):
        train(tiny_config(**{"model.dx": 100000, "model.dt": 8, "model.n_tokens": 16}), str(tmp_path / "run"))
    assert time.perf_counter() - start < 60
    assert not (tmp_path / "run").exists()  # nothing saved, nothing left


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


def test_a_very_long_sentence_is_read_not_called_malformed(tmp_path):
    """A 100,000-word sentence is past the csv module's default field limit (131,072 characters)."""
    from rank4jax.data.readers import read_stories

    long = " ".join(["word"] * 100_000) + "."
    path = tmp_path / "long.csv"
    path.write_text(ROC_HEADER + f"s1,T,{long},Two.,Three.,Four.,Five.\r\n", encoding="utf-8")
    (story,) = read_stories(str(path), "rocstories")
    assert story.sentences[0] == long and len(story.sentences) == 5


def test_a_refused_run_leaves_the_workdir_as_it_found_it(tmp_path):
    """A run refused during setup (here: a vocabulary of special tokens only) removes the lock file,
    the empty checkpoints/ and the workdir it created; a workdir that existed keeps what it held."""
    from rank4jax.errors import DataError

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


def _mount_namespaces() -> bool:
    """Whether this machine lets a test mount a tmpfs in a private mount namespace (root, unshare)."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return False
    probe = ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=4k tmpfs /mnt"]
    return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0


def _bytes(size: str) -> float:
    """'290 KB' or '1.4 MB' (a storage error's figure) in bytes."""
    number, unit = size.split()
    return float(number) * {"KB": 1e3, "MB": 1e6, "GB": 1e9}[unit]


def test_a_full_disk_is_one_line_naming_the_failed_save_and_every_intact_checkpoint(tmp_path):
    """train.py on a 2 MB tmpfs (three or four tiny checkpoints fit): one line, exit 2, the step whose save
    was refused, the cause with the space it needs, and every checkpoint still on disk. The save is
    refused before any of it is written (a save failing midway left TensorStore's "Event loop is
    closed" tracebacks on stderr), so no partial directory is left either."""
    if not _mount_namespaces():
        pytest.skip("needs root and a private mount namespace (unshare -m) to mount a small tmpfs")
    disk = tmp_path / "disk"
    disk.mkdir()
    flags = [
        *TINY_FLAGS,
        "--config.num_steps=40",
        "--config.eval_every=2",
        "--config.checkpoint_every=2",
        "--config.keep_checkpoints=100",
    ]
    train_py = " ".join([sys.executable, "train.py", f"--workdir={disk}/run", *flags])
    script = f"mount -t tmpfs -o size=2m tmpfs {disk} && {train_py}; echo status $?; ls -a {disk}/run/checkpoints"
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=SUBPROCESS_XLA_FLAGS)
    out = subprocess.run(["unshare", "-m", "sh", "-c", script], cwd=REPO, capture_output=True, text=True, env=env)
    err = [line for line in out.stderr.splitlines() if "are cut" not in line]
    events = f"rank4jax: warning: the TensorBoard event file in {disk}/run stops here: No space left on device"
    err = [line for line in err if line != events]  # an extra the run goes on without, if it failed first
    assert len(err) == 1, out.stderr[-3000:]
    status, *listing = out.stdout.split("status ")[-1].split()
    on_disk = sorted(int(name) for name in listing if name.isdigit())
    failed = int(err[0].split("cannot save checkpoint ")[1].split()[0])
    need, free = err[0].split("(it needs about ")[1].split(" free)")[0].split(", ")
    assert err[0] == (
        f"error: cannot save checkpoint {failed} in {disk}/run: No space left on device (it needs about "
        f"{need}, {free} free); checkpoints {', '.join(map(str, on_disk))} are intact"
    )
    assert status == "2" and on_disk == list(range(2, failed, 2)) and len(on_disk) >= 2
    assert _bytes(need) > _bytes(free)
    assert sorted(listing) == sorted([".", "..", *map(str, on_disk)])  # no partial directory


def test_a_full_disk_stops_both_processes_of_a_two_process_run_at_once(tmp_path):
    """Process 0 checks the checkpoints/ the processes share before each save, and both hear its
    answer before either enters orbax's save: on a 2 MB tmpfs both exit 2 at once, process 0
    naming the cause, process 1 pointing to it (refused by process 0 alone, process 1 waited at
    orbax's barrier until JAX's distributed service aborted it, five minutes later)."""
    if not _mount_namespaces():
        pytest.skip("needs root and a private mount namespace (unshare -m) to mount a small tmpfs")
    disk, port = tmp_path / "disk", free_port()
    disk.mkdir()
    flags = [*TINY_FLAGS, "--config.num_steps=40", "--config.checkpoint_every=2", "--config.keep_checkpoints=100"]
    two = [f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2", "--distributed"]
    train_py = " ".join([sys.executable, "train.py", f"--workdir={disk}/run", *flags, *two])
    runs = [
        f"({train_py} --process_id={i} 2> {tmp_path}/err{i} > /dev/null; echo $? > {tmp_path}/status{i})"
        for i in (0, 1)
    ]
    script = f"mount -t tmpfs -o size=2m tmpfs {disk} || exit 1; {runs[0]} & {runs[1]} & wait"
    subprocess.run(["unshare", "-m", "sh", "-c", script], cwd=REPO, env=launcher.command_env(), timeout=240, check=True)
    statuses = [(tmp_path / f"status{i}").read_text().strip() for i in (0, 1)]
    events = f"rank4jax: warning: the TensorBoard event file in {disk}/run stops here: No space left on device"
    noise = ("Gloo", "are cut")  # gloo's connection note; the tiny corpus's cut sentences
    errors = [
        [
            line
            for line in (tmp_path / f"err{i}").read_text().splitlines()
            if line != events and not any(n in line for n in noise)  # events: an extra, if it failed first
        ]
        for i in (0, 1)
    ]
    assert statuses == ["2", "2"], errors
    assert len(errors[0]) == 1 and errors[0][0].startswith("error: cannot save checkpoint "), errors[0]
    step = int(errors[0][0].split("cannot save checkpoint ")[1].split()[0])
    intact = list(range(2, step, 2))  # every save before the refused one
    kept = f"checkpoints {', '.join(map(str, intact))} are intact" if len(intact) > 1 else "checkpoint 2 is intact"
    assert step >= 4 and errors[0][0].endswith(kept), errors[0]
    assert errors[1] == [f"error: process 0 refused to save checkpoint {step} in {disk}/run (its error says why)"]


def test_a_failed_saves_partial_directory_is_removed_at_the_next_start(tiny_run_copy):
    partial = tiny_run_copy / "checkpoints" / "8.orbax-checkpoint-tmp"
    (partial / "state").mkdir(parents=True)
    assert train(tiny_config(), str(tiny_run_copy))["step"] == 6  # finished: restores, trains nothing
    assert sorted(os.listdir(tiny_run_copy / "checkpoints")) == ["4", "6"]


def test_opening_the_checkpoints_removes_partial_directories_before_it_returns(tmp_path):
    """orbax's clean-up runs in a thread it does not join on close: a refused run that then removed
    its empty checkpoints/ raced it (a traceback from that thread). rank4jax removes them itself before
    the manager is built, and orbax's is off."""
    partial = tmp_path / "checkpoints" / "8.orbax-checkpoint-tmp"
    (partial / "state").mkdir(parents=True)
    ckpt = storage.RunCheckpoints(str(tmp_path))
    assert os.listdir(tmp_path / "checkpoints") == []
    (tmp_path / "checkpoints").rmdir()  # what a refused run's undo does, before the manager closes
    ckpt.close()


def test_a_finished_run_whose_last_step_has_no_logged_loss_validates_it_on_rerun(tiny_run, tiny_run_copy, capsys):
    """Step 6 saved without a logged validation (as an older version did at a signal during the last
    validation): the rerun trains nothing, validates 6, logs its loss, and 6 is best again."""
    from rank4jax.records import read_metrics

    loss = next(r["window_ce"] for r in read_metrics(str(tiny_run))["validation"] if r["step"] == 6)
    path = tiny_run_copy / "metrics.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(x for x in lines if not ('"validation"' in x and '"step": 6,' in x)) + "\n")
    with storage.RunCheckpoints(str(tiny_run_copy), read_only=True) as ckpt:
        assert ckpt.best_step() == 4
    assert train(tiny_config(), str(tiny_run_copy))["step"] == 6
    assert f"step 6: its checkpoint had no logged validation loss: {loss:.4f} added" in capsys.readouterr().out
    with storage.RunCheckpoints(str(tiny_run_copy), read_only=True) as ckpt:
        assert ckpt.best_metric() == (6, loss)


def test_a_checkpoint_directory_made_unwritable_mid_run_is_one_error_at_the_next_save(tmp_path):
    """``chattr +i checkpoints/`` after the first save: the next save is one WorkdirError within
    seconds naming the step, the cause and the intact checkpoint (orbax alone waits 300 s at a barrier,
    then raises a TimeoutError)."""
    directory = tmp_path / "checkpoints"

    def freeze(step, state):
        if step == 3:  # once checkpoint 2 is committed (orbax renames its temporary directory last)
            deadline = time.monotonic() + 60
            while os.listdir(directory) != ["2"] and time.monotonic() < deadline:
                time.sleep(0.01)
            subprocess.run(["chattr", "+i", str(directory)], check=True, capture_output=True)

    probe = tmp_path / "probe"
    probe.mkdir()
    if subprocess.run(["chattr", "+i", str(probe)], capture_output=True).returncode:
        pytest.skip("chattr +i is not available here (needs root on a filesystem with immutable flags)")
    subprocess.run(["chattr", "-i", str(probe)], check=True)
    try:
        with pytest.raises(WorkdirError) as error:
            train(tiny_config(), str(tmp_path), hooks=[freeze])
    finally:
        subprocess.run(["chattr", "-i", str(directory)], check=True)
    expected = f"cannot save checkpoint 4 in {tmp_path}: Operation not permitted; checkpoint 2 is intact"
    assert str(error.value) == expected
    assert sorted(os.listdir(directory)) == ["2"]


def test_a_signal_outside_an_experiments_training_stages_is_one_line_with_the_resume_hint(tmp_path):
    """``run_experiment`` (every experiment command's body) in a real process: SIGTERM while it sets up
    or evaluates (here: the body signals itself) is one line and 143; a user error one line and 2; and
    a signal after it has finished says the results are written."""
    script = tmp_path / "experiment.py"
    script.write_text(
        "import os, signal, sys, time\n"
        "from rank4jax.cli import run_experiment\n"
        "from rank4jax.errors import ConfigError\n"
        "def body():\n"
        "    if sys.argv[1] == 'error':\n"
        "        raise ConfigError('--ks must each be at least 1, got 0')\n"
        "    if sys.argv[1] == 'during':\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        time.sleep(30)\n"
        "run_experiment('ladder', body)\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "time.sleep(30)\n"
    )
    during, error, after = (launcher.run(str(script), moment, timeout=60) for moment in ("during", "error", "after"))
    assert (during.returncode, during.stderr) == (
        143,
        "stopped: SIGTERM during ladder; rerun the same command to resume (finished runs are kept)\n",
    )
    assert (error.returncode, error.stderr) == (2, "error: --ks must each be at least 1, got 0\n")
    assert (after.returncode, after.stderr) == (
        130,
        "stopped: SIGINT after the ladder had finished; its results are written\n",
    )


@pytest.mark.parametrize("script", ["eval.py", "compare.py", "ladder.py", "cloze_contexts.py"])
def test_ctrl_c_while_a_command_imports_is_one_line_and_130(script, tmp_path):
    proc = _start([script, f"--workdir={tmp_path}"])
    while not _jaxlib_loaded(proc.pid):  # its first statement has run: the libraries are importing
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out, err) == (130, "", "stopped: SIGINT while starting; nothing was read or written\n")


def test_cloze_contexts_settings_and_data_are_one_line_each(tiny_run, tmp_path):
    from rank4jax.experiments.cloze_contexts import check_settings, context_spread

    refusals = {
        (1, (8,), 200): "--pool must be at least 2 (the pool factor divides by pool − 1), got 1",
        (128, (0, 8), 200): "--ks must each be at least 1, got 0,8",
        (128, (-1,), 200): "--ks must each be at least 1, got -1",
        (128, (100000,), 200): "--ks: K=100000 is more than the pool of --pool=128 lenders it is drawn from",
        (128, (8,), 1): "--draws must be at least 2 (the spread's standard deviation needs two), got 1",
    }
    for (pool, ks, draws), message in refusals.items():
        with pytest.raises(ConfigError) as caught:
            check_settings(pool, ks, draws)
        assert str(caught.value) == message
    rocstories = tmp_path / "roc.csv"  # five sentences a story: no endings to choose between
    rocstories.write_text(
        "storyid,storytitle,sentence1,sentence2,sentence3,sentence4,sentence5\n"
        "a,,Tom ran.,He fell.,He cried.,Mom came.,All was well.\n"
    )
    with pytest.raises(DataError) as caught:
        context_spread(str(tiny_run), str(rocstories), ks=(8,), draws=2)
    assert str(caught.value).startswith(f"{rocstories} holds 0 Story Cloze stories (a context, two endings")
    import rank4jax.experiments.cloze_contexts as cloze_contexts

    with pytest.MonkeyPatch.context() as patch:  # a file whose one story the run trained on
        patch.setattr(cloze_contexts, "check_held_out", lambda *args, **kwargs: 1)
        with pytest.raises(ConfigError, match="^1 of the 1 stories of .* are stories this run trained on"):
            context_spread(str(tiny_run), str(rocstories), ks=(8,), draws=2)
    out = launcher.run("cloze_contexts.py", f"--workdir={tiny_run}", "--cloze_data=x.csv", "--ks=a")
    assert (out.returncode, out.stderr) == (2, "error: --ks must be whole numbers separated by commas, got 'a'\n")


def test_a_signal_while_a_run_starts_unwinds_it_and_one_after_it_stops_once_it_is_complete(
    tmp_path, monkeypatch, capsys
):
    """SIGTERM while compiling (before the loop): ``train`` raises SignalInterrupt having released its
    lock and removed the checkpoints/ it made; SIGTERM while the summary is written: one line, the
    summary and curves complete, then StageInterrupted (an experiment no longer went on to its next
    stage after a Ctrl-C at the end of one)."""
    import rank4jax.training.loop as loop
    from rank4jax.errors import SignalInterrupt

    compile_first = loop._compile_on_first_batch

    def signalled_while_compiling(*args):
        signal.raise_signal(signal.SIGTERM)
        return compile_first(*args)

    monkeypatch.setattr(loop, "_compile_on_first_batch", signalled_while_compiling)
    workdir = tmp_path / "run"
    with pytest.raises(SignalInterrupt) as caught:
        train(tiny_config(), str(workdir))
    assert caught.value.signum == signal.SIGTERM
    assert sorted(os.listdir(workdir)) == ["config.json"]  # no lock file, no checkpoints/
    monkeypatch.undo()

    write_summary = loop.write_summary

    def signalled_while_finishing(*args):
        signal.raise_signal(signal.SIGTERM)
        return write_summary(*args)

    monkeypatch.setattr(loop, "write_summary", signalled_while_finishing)
    with pytest.raises(StageInterrupted) as caught:  # complete, then the command stops (no next stage)
        train(tiny_config(plots=True), str(workdir))
    assert str(caught.value) == f"SIGTERM after training had ended; {workdir} is complete at step 6"
    assert caught.value.status == 143
    assert json.load(open(workdir / "train_summary.json"))["step"] == 6 and (workdir / "plots" / "curves.png").is_file()
    assert (
        "rank4jax: SIGTERM: training has ended; writing its summary first, then stopping\n" in capsys.readouterr().err
    )
    monkeypatch.undo()
    assert train(tiny_config(plots=True), str(workdir))["step"] == 6  # rerun: complete, nothing to do


def test_best_without_a_validated_checkpoint_and_k_beyond_the_stories_are_said(tiny_run_copy, tmp_path, capsys):
    """'best' where no checkpoint carries a validation loss (a run stopped at step 1) is the latest, with
    a warning; K beyond the stories of a Story Cloze file is capped at their number, with a warning."""

    def interrupt_at_1(step, state):
        if step == 1:
            signal.raise_signal(signal.SIGINT)

    workdir = str(tmp_path / "stopped")
    train(tiny_config(), workdir, hooks=[interrupt_at_1])
    capsys.readouterr()
    with storage.RunCheckpoints(workdir, read_only=True) as ckpt:
        assert resolve_step(ckpt, "best") == 1
    assert capsys.readouterr().err == (
        f"rank4jax: warning: no checkpoint in {workdir} has a logged validation loss; 'best' is the latest, step 1\n"
    )
    cloze = tmp_path / "cloze.csv"
    cloze.write_text(
        "InputSentence1,InputSentence2,InputSentence3,InputSentence4,RandomFifthSentenceQuiz1,"
        "RandomFifthSentenceQuiz2,AnswerRightEnding\n"
        + "".join(
            f"Anna went out {i}.,She saw a dog.,It ran.,She ran.,She was happy.,She was sad.,1\n" for i in range(3)
        )
    )
    report = evaluate_run(str(tiny_run_copy), "all", data_path=str(cloze), num_examples=0, rollout_steps=0)
    assert report["cloze_stories"] == 3
    expected = "rank4jax: warning: cloze_contexts=8: each of the 3 Story Cloze stories can borrow 2 other contexts"
    assert f"{expected}; K = 2 is used\n" in capsys.readouterr().err


def test_checkpoints_are_five_public_items_and_restore_parameters_alone(tiny_run):
    """A checkpoint holds params and opt_state (StandardSave), data_iter, config and tokenizer (JSON),
    as its metadata names them; the parameters restore alone, equal to the whole state's."""
    from rank4jax.checkpoint.storage import RunCheckpoints

    with RunCheckpoints(str(tiny_run), read_only=True) as checkpoints:
        step = checkpoints.latest_step()
        with open(os.path.join(checkpoints.step_dir(step), "_CHECKPOINT_METADATA"), encoding="utf-8") as f:
            handlers = json.load(f)["item_handlers"]
        assert {item: handler.rsplit(".", 1)[-1] for item, handler in handlers.items()} == {
            "params": "StandardCheckpointHandler", "opt_state": "StandardCheckpointHandler",
            "data_iter": "JsonCheckpointHandler", "config": "JsonCheckpointHandler",
            "tokenizer": "JsonCheckpointHandler",
        }  # fmt: skip
        run = describe_run(checkpoints, step)
        whole = checkpoints.restore_state(step, run.abstract_state)
        params = checkpoints.restore_params(step, run.abstract_state.params)
    assert int(whole.step) == step and jax.tree.structure(params) == jax.tree.structure(whole.params)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(whole.params), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_saved_config_that_does_not_fit_its_arrays_is_damage_in_one_line(tiny_run_copy, capsys):
    """A checkpoint whose saved config was edited (``model.n_heads`` 2 → 1): the item's own metadata is
    read first and the mismatch is damage named in one warning line per checkpoint, before any
    restore (no library traceback); with none left, one error, and nothing moved."""
    edited = 0
    for path in glob.glob(str(tiny_run_copy / "checkpoints" / "*" / "config" / "*")):
        try:
            with open(path, encoding="utf-8") as f:
                saved = json.load(f)
        except ValueError:
            continue  # not the config's JSON
        saved["model"]["n_heads"] = 1
        with open(path, "w", encoding="utf-8") as f:
            json.dump(saved, f)
        edited += 1
    assert edited == 2  # steps 4 and 6
    with pytest.raises(CheckpointError, match=r"no readable checkpoint in .* \(6: its params layers/0/attn/wk is "
                       r"\(2, 8, 8\), where its config makes it \(1, 8, 8\); 4: "):  # fmt: skip
        load_run(str(tiny_run_copy))
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.splitlines()) == 2
    assert sorted(os.listdir(tiny_run_copy / "checkpoints")) == ["4", "6"]  # nothing moved aside
    assert not (tiny_run_copy / "damaged_checkpoints").exists()


def test_items_that_are_not_the_steps_are_damage_and_the_run_falls_back(tiny_run, tmp_path, capsys):
    """A data position that is not the checkpoint's batch (hostile JSON, another step's item) or an
    optimiser state of another step: the checkpoint is damage, moved aside in one warning line, and
    the run resumes from the one before, to the uninterrupted run's parameters."""
    wrong = {"true": {"next_index": True}, "negative": {"next_index": -5}, "text": {"next_index": "abc"},
             "other_step": {"next_index": 4}, "huge": {"next_index": 2**63}, "a_list": [200], "null": None}  # fmt: skip
    for name, value in [*wrong.items(), ("opt_state", "step 4's")]:
        run = tmp_path / name
        shutil.copytree(tiny_run, run)
        if name == "opt_state":  # step 4's optimiser state in checkpoint 6
            shutil.rmtree(run / "checkpoints" / "6" / "opt_state")
            shutil.copytree(run / "checkpoints" / "4" / "opt_state", run / "checkpoints" / "6" / "opt_state")
        else:
            (run / "checkpoints" / "6" / "data_iter" / "metadata").write_text(json.dumps(value))
        summary = train(tiny_config(), str(run))
        err = capsys.readouterr().err
        assert "checkpoint 6" in err and "is damaged" in err and "Traceback" not in err, (name, err)
        assert summary["step"] == 6 and (run / "damaged_checkpoints" / "6").is_dir()
        np.testing.assert_array_equal(_params(run, 6)["embed"]["sem"], _params(tiny_run, 6)["embed"]["sem"])


@pytest.mark.parametrize("kind", ["device", "fifo"])
def test_a_device_or_a_fifo_as_data_is_refused_unread(kind, tmp_path):
    """/dev/zero spun at 100 % CPU (the data was hashed before the "not a file" check) and a FIFO with
    no writer blocked; both are one DataError now, before anything is read."""
    path = "/dev/zero"
    if kind == "fifo":
        path = str(tmp_path / "fifo")
        os.mkfifo(path)
    with pytest.raises(DataError, match=f"^data path is not a file: {re.escape(path)}$"):
        train(tiny_config(**{"data.source": "file", "data.path": path}), str(tmp_path / "run"))


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


def test_raising_num_steps_under_a_decaying_schedule_says_the_rate_jump(tmp_path, capsys):
    """A cosine run resumed with more steps re-stretches the decay; the resume says by how much the
    rate at the resumed step moves, not only "num_steps: 6 → 10"."""
    from rank4jax.engine.state import learning_rate_schedule

    config = tiny_config(**{"optim.schedule": "cosine"})
    train(config, str(tmp_path))
    longer = tiny_config(**{"optim.schedule": "cosine", "num_steps": 10})
    train(longer, str(tmp_path))
    before = float(learning_rate_schedule(config.optim, 6)(6))
    after = float(learning_rate_schedule(longer.optim, 10)(6))
    expected = (
        f"rank4jax: warning: num_steps 6 → 10 stretches the cosine decay over the new length: the learning "
        f"rate at step 6 goes from {before:.3g} to {after:.3g}"
    )
    assert expected in capsys.readouterr().err


def test_json_files_of_the_wrong_shape_are_read_as_absent(tmp_path, capsys):
    """A run's config.json {"optim": 5}, a train_summary.json [1] and metrics records without their
    figures crashed ladder.py (and train.py at the end of training) on every rerun; each is now read as
    absent, with a warning naming it."""
    from rank4jax.experiments import ladder as lad
    from rank4jax.training.metrics import read_json, read_metrics, training_seconds

    (tmp_path / "train_summary.json").write_text("[1]")
    assert read_json(str(tmp_path / "train_summary.json"), "the run's summary") is None
    assert "holds a JSON list, not an object; read as absent" in capsys.readouterr().err
    lines = [
        {"step": 2, "split": "train", "loss": 1.0, "windows_per_s": 8.0, "interval_s": 2.0},
        {"step": 4, "split": "train", "loss": 1.0},  # no windows_per_s
        {"step": 4, "split": "validation", "window_ce": 2.0},  # no last_slice_ce
        {"step": 6, "split": "validation", "window_ce": 2.0, "last_slice_ce": 3.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    metrics = read_metrics(str(tmp_path))
    assert [r["step"] for r in metrics["train"]] == [2] and [r["step"] for r in metrics["validation"]] == [6]
    assert "2 unreadable line(s) skipped" in capsys.readouterr().err
    assert training_seconds(metrics["train"], 8) == 2.0
    run = tmp_path / "d8" / "rank4"
    run.mkdir(parents=True)
    (run / "config.json").write_text('{"optim": 5}')
    lad.check_trained_rates(str(tmp_path), {"d8/rank4": tiny_config()})  # no rate known: nothing refused
    (run / "diverged.json").write_text("{}")
    assert lad.train_run("d8/rank4", tiny_config(), str(run)) is None  # recorded as diverged, no error text


def test_loading_a_run_logs_no_warning(tiny_run, caplog):
    """Every load_run printed orbax's two read-only warnings ("…setting save_interval_steps=0", "Given
    directory is read only"); a reader now opens the manager without orbax's read_only flag, and
    refuses to save by itself."""
    import logging

    from rank4jax.checkpoint.storage import RunCheckpoints

    with caplog.at_level(logging.WARNING):
        load_run(str(tiny_run))
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    with RunCheckpoints(str(tiny_run), read_only=True) as reader, pytest.raises(CheckpointError, match="to read"):
        reader.save(99, None, None, {}, None)


def test_a_signal_lost_in_a_finalizer_while_starting_still_stops_the_run():
    """A SignalInterrupt raised inside a finalizer is only printed by Python ("Exception ignored"); the
    handler keeps the signal, and the start of the loop raises it."""
    from rank4jax.errors import SignalInterrupt
    from rank4jax.training.signals import StopRequest

    with StopRequest() as stop:
        try:
            stop._handle(signal.SIGINT, None)  # what the signal does while a finalizer runs …
        except SignalInterrupt:
            pass  # … whose exception Python drops
        with pytest.raises(SignalInterrupt) as caught:
            stop.training()
    assert caught.value.signum == signal.SIGINT


def test_a_signal_during_a_garbage_collection_is_raised_after_it_and_nothing_is_printed():
    """A signal that lands in a garbage-collection callback (JAX runs one at every collection): raised
    there, Python printed "Exception ignored in: <function _xla_gc_callback …>" and a traceback before
    the command's own line (seen once from eval.py). It is sent again once the collection is over. An
    interrupt swallowed all the same (in a finalizer, or by a library) stops the command when its work
    is done, and its line says so. (Processes of their own: a small heap collects in well under 10 ms.)"""
    during = """
import gc, signal, time
from rank4jax.cli import stop_on_signals
from rank4jax.errors import SignalInterrupt
from rank4jax.training.signals import StopRequest

def callback(phase, info):  # the signal lands while a garbage-collection callback runs
    if phase == "start" and not fired:
        fired.append(phase)
        signal.raise_signal(signal.SIGINT)  # its handler runs here, inside the callback

gc.callbacks.append(callback)
fired = []
try:
    with StopRequest():  # a run starting
        gc.collect()
        time.sleep(5)  # the signal sent again lands here
except SignalInterrupt as e:
    print("run:", signal.Signals(e.signum).name, fired)
fired.clear()
with stop_on_signals("evaluation"):
    gc.collect()
    time.sleep(5)
    print("not reached")
"""
    swallowed = """
import signal
from rank4jax.cli import stop_on_signals
with stop_on_signals("evaluation"):
    try:
        signal.raise_signal(signal.SIGINT)
    except KeyboardInterrupt:
        pass  # a library that swallows it
    print("written")
"""
    results = [launcher.run("-c", code) for code in (during, swallowed)]
    assert [(r.returncode, r.stdout, r.stderr) for r in results] == [
        (130, "run: SIGINT ['start']\n", "stopped: SIGINT during evaluation; no report was written after it\n"),
        (130, "written\n", "stopped: SIGINT after the evaluation had finished; its output is written\n"),
    ]


def test_a_storage_fault_after_a_completed_save_names_what_is_really_on_disk(tmp_path):
    """chattr +i on checkpoints/ as save 60 finished: the message said "cannot save checkpoint 60 …;
    checkpoints 20, 40 are intact" where 60 was complete and 20 an emptied directory (its deletion by
    the keep policy failed half-way). It now says what each directory holds."""
    import errno

    checkpoints = tmp_path / "checkpoints"
    for step in (40, 60):
        (checkpoints / str(step)).mkdir(parents=True)
        (checkpoints / str(step) / "commit_success.txt").write_text("ok")
    (checkpoints / "20").mkdir()
    error = storage.storage_error(OSError(errno.EPERM, "Operation not permitted"), str(tmp_path), 60)
    assert str(error) == (
        f"checkpoint 60 in {tmp_path} was saved, but what followed it failed: Operation not permitted; "
        "checkpoints 40, 60 are intact (20 incomplete: its files were removed)"
    )
    error = storage.storage_error(OSError(errno.ENOSPC, "No space left on device"), str(tmp_path), 80)
    assert str(error) == (
        f"cannot save checkpoint 80 in {tmp_path}: No space left on device; checkpoints 40, 60 are intact "
        "(20 incomplete: its files were removed)"
    )


def test_a_batch_whose_logits_cannot_fit_is_refused_before_training(tmp_path):
    """--config.eval_batch_size=100000000 trained, then failed allocating 22 GiB at the first
    validation; now one ConfigError before any step."""
    with pytest.raises(ConfigError, match=r"^eval_batch_size=100,000,000: one batch's logits \(32 positions × "):
        train(tiny_config(eval_batch_size=100_000_000), str(tmp_path))
    assert not (tmp_path / "checkpoints").exists() or os.listdir(tmp_path / "checkpoints") == []


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


def test_windows_that_cannot_fit_in_memory_are_refused_before_allocating(tmp_path):
    """--config.model.n_tokens=10000000 failed deep in numpy (or as RESOURCE_EXHAUSTED); now one line."""
    with pytest.raises(
        ConfigError, match=r"^model.n_tokens=10,000,000: the .* windows of 5 states of 10,000,000 tokens"
    ):
        train(tiny_config(**{"model.n_tokens": 10_000_000}), str(tmp_path))


def test_changed_data_contents_are_refused_on_resume_and_by_evaluation(tmp_path):
    """A resume and eval.py read the data a checkpoint's config names whatever it now holds: a changed
    file (or a crafted config naming another) was split and scored as if held out. Its bytes are checked."""
    rows = [
        f"s{i},T,Anna went to the shop {i}.,She bought tea.,It was hot.,She waited.,She drank it.\r\n"
        for i in range(60)
    ]
    path = tmp_path / "roc.csv"
    path.write_text(ROC_HEADER + "".join(rows), encoding="utf-8")
    config = tiny_config(**{"data.source": "file", "data.path": str(path), "num_steps": 2})
    workdir = str(tmp_path / "run")
    train(config, workdir)
    config.num_steps = 4
    assert train(config, workdir)["step"] == 4  # the same contents: resumes
    assert evaluate_run(workdir, split="test", num_examples=0, rollout_steps=0)["stories"] > 0
    path.write_text(ROC_HEADER + "".join(rows[:-1]) + rows[-1].replace("tea", "coffee"), encoding="utf-8")
    config.num_steps = 6
    with pytest.raises(CheckpointError, match=f"the data at {path} has changed since these checkpoints were written"):
        train(config, workdir)
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["2", "4"]
    with pytest.raises(DataError, match=f"^the data at {re.escape(str(path))} has changed since"):
        evaluate_run(workdir, split="test", num_examples=0, rollout_steps=0)


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


def test_a_signal_while_the_last_save_finishes_stops_the_command(tiny_run_copy, monkeypatch):
    """A Ctrl-C after the loop last read its flag (while the final save was being written) was lost:
    the command went on and exited 0. It now stops once the run is complete, as a late signal does.
    Before its first save a run never waits on orbax: a Ctrl-C while it started could land in orbax's
    wait, which logged it as a failed save above the run's own line."""
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
    with pytest.raises(StageInterrupted, match="SIGINT after training had ended; .* is complete at step 8"):
        train(tiny_config(num_steps=8), str(tiny_run_copy), hooks=[hook])
    assert manager_calls[0] == "save", manager_calls  # the resumed run's start waited on nothing
    with storage.RunCheckpoints(str(tiny_run_copy), read_only=True) as ckpt:
        assert ckpt.latest_step() == 8  # saved whole


def test_refusals_before_any_work(tiny_run_copy, tmp_path, monkeypatch, capsys):
    """Each refused in one line before the run trains or writes: a workdir that is a file, a seed out of
    range, a lock file the disk cannot hold, a disk too small for the next save (found at the start, not
    after training to it), a ladder's --status on a workdir that does not exist, compare's
    --cloze_contexts=-1 (before its first stage trains); a vocabulary's escape sequences are shown
    escaped; a checkpoint without a data fingerprint names the file it evaluates on."""
    import errno

    from rank4jax.cli import terminal_safe
    from rank4jax.experiments import compare, ladder

    (tmp_path / "file").write_text("x")
    with pytest.raises(WorkdirError, match="is a file, not a directory; nothing was changed"):
        train(tiny_config(), str(tmp_path / "file"))
    for seed in (-1, 2**70):
        with pytest.raises(ConfigError, match="seed must be an integer from 0 to 4,294,967,295"):
            train(tiny_config(seed=seed), str(tmp_path / "seed"))
    real_pwrite = os.pwrite

    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(WorkdirError, match=r"cannot write the lock file .*\.lock: No space left on device"):
        train(tiny_config(), str(tmp_path / "lock"))
    monkeypatch.setattr(os, "pwrite", real_pwrite)
    before = (tiny_run_copy / "metrics.jsonl").read_text()
    monkeypatch.setattr(storage, "free_bytes", lambda directory: 1000)
    with pytest.raises(WorkdirError, match=r"cannot save checkpoint 8 in .*: No space left on device \(it needs"):
        train(tiny_config(num_steps=8), str(tiny_run_copy))
    assert (tiny_run_copy / "metrics.jsonl").read_text() == before  # nothing trained
    monkeypatch.undo()
    with pytest.raises(ConfigError, match="no ladder there yet"):
        ladder.status(tiny_config(), str(tmp_path / "none"), ladder.LadderPlan())
    with pytest.raises(ConfigError, match="--cloze_contexts must be a non-negative integer"):
        compare.compare(tiny_config(), tiny_config(model_family="baseline"), str(tmp_path / "cmp"), cloze_contexts=-1)
    assert not (tmp_path / "cmp").exists()
    assert terminal_safe("a\x1b[2Jb\x07") == "a\\x1b[2Jb\\x07"
    import dataclasses

    from rank4jax.engine.sharding import check_batches_fit
    from rank4jax.prediction import predict_next

    huge = load_run(str(tiny_run_copy))  # one window's logits beyond memory: named as n_tokens, not the batch
    huge.model_cfg = dataclasses.replace(huge.model_cfg, n_tokens=10**9)
    with pytest.raises(ConfigError, match="^model.n_tokens=1,000,000,000: one window's logits need"):
        predict_next(huge, ["a."] * 4)
    with pytest.raises(ConfigError, match="^model.n_tokens=1,000,000,000: .* lower model.n_tokens$"):
        check_batches_fit(tiny_config(**{"model.n_tokens": 10**9}), 200, 1, ("eval_batch_size",))
    run = describe_run(storage.RunCheckpoints(str(tiny_run_copy), read_only=True), "latest")
    run.data_fingerprint, run.config.data.source, run.config.data.path = None, "file", "stories.csv"
    from rank4jax.evaluation.report import check_same_data

    check_same_data(run, "w")
    assert "records no fingerprint of its data: evaluating on stories.csv as it is now" in capsys.readouterr().err
