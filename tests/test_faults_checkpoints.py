"""Faults of checkpoints: damaged files (evaluation and resume fall back to the newest readable one, a
resume moves the damaged one aside), items that are not their step's, a full or unwritable disk during
a save, partial saves, and what a checkpoint holds. Each ends in one line, nothing saved lost."""

import glob
import json
import math
import os
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
    TrainingDivergedError,
    WorkdirError,
)
from rank4jax.evaluation.report import evaluate_run, restore_for_evaluation
from rank4jax.runs import describe_run, load_run, resolve_step
from rank4jax.training import output
from rank4jax.training.loop import train
from tests import launcher
from tests.conftest import REPO, SUBPROCESS_XLA_FLAGS
from tests.fault_helpers import (
    DAMAGE,
    LIBRARY_LINES_OF_A_DAMAGED_READ,
    TINY_FLAGS,
    _bytes,
    _mount_namespaces,
    _params,
    restore_state_numpy,
)
from tests.helpers import free_port, tiny_config


@LIBRARY_LINES_OF_A_DAMAGED_READ
@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_eval_falls_back_from_a_damaged_checkpoint_and_leaves_it(kind, tiny_run_copy, capsys):
    """Seven kinds of damage to the newest checkpoint (6): evaluation's restore (``eval.py``'s first
    step) of 'latest' and 'best' warns, names checkpoint 6 as damaged (never a config mismatch) and
    gives checkpoint 4, leaving 6 in place; asked for by number, 6 is one error; the library's
    background read errors stay quiet."""
    step6 = tiny_run_copy / "checkpoints" / "6"
    before = sorted(p.name for p in step6.rglob("*"))
    DAMAGE[kind](str(step6))
    damaged_files = sorted(p.name for p in step6.rglob("*"))
    for which in ("latest", "best"):
        run, _, _ = restore_for_evaluation(str(tiny_run_copy), which)
        assert run.step == 4
        err = capsys.readouterr().err
        assert "Traceback" not in err and "match" not in err and "bound method" not in err, err
        if kind == "empty_step_dir" and "checkpoint 6" not in err:  # a read-only manager does not list an
            continue  # empty step directory at all
        assert f"checkpoint 6 in {tiny_run_copy} is damaged and cannot be read" in err
        about_checkpoints = [line for line in err.strip().splitlines() if "are cut" not in line]  # not the data's
        assert len(about_checkpoints) == 1, err
    assert sorted(p.name for p in step6.rglob("*")) == damaged_files and (kind == "empty_step_dir" or before)
    with pytest.raises(CheckpointError, match="checkpoint 6 .* is damaged|no checkpoint at step 6"):
        restore_for_evaluation(str(tiny_run_copy), 6)


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


def test_best_without_a_validated_checkpoint_and_k_beyond_the_stories_are_said(tiny_run_copy, tmp_path, capsys):
    """'best' where no checkpoint carries a validation loss (a run stopped at step 1) is the latest, with
    a warning; K beyond the stories of a Story Cloze file is capped at their number, with a warning."""

    def interrupt_at_1(step, state):
        if step == 1:
            signal.raise_signal(signal.SIGTERM)  # saves step 1 and stops

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
    for bad in ({"next_index": True}, {"next_index": -5}, {"next_index": 2**63}, [200], None, {}, {"next_index": 6.0}):
        with pytest.raises(CheckpointDamaged, match=r"its data position is .*, not batch 6"):
            damage.check_position("w", 6, 6, bad)
    with pytest.raises(CheckpointDamaged, match="its optimiser state is at step 4"):
        damage.check_position("w", 6, 4, {"next_index": 6})
    wrong = {"text": {"next_index": "abc"}, "other_step": {"next_index": 4}}
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
