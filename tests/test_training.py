"""End-to-end training, resume, checkpoints and evaluation on tiny runs."""

import json
import os
import signal

import jax
import numpy as np
import pytest

from rank4jax.checkpoint.storage import RunCheckpoints
from rank4jax.data.windows import cloze_windows
from rank4jax.engine.data_setup import prepare_split
from rank4jax.errors import CheckpointError, ConfigError, DataError, TrainingDivergedError
from rank4jax.evaluation.report import evaluate_run
from rank4jax.runs import load_run
from rank4jax.training.loop import train
from rank4jax.training.metrics import read_metrics, training_seconds
from tests.helpers import compile_log, tiny_config


def _params_close(a, b, atol):
    leaves_a, leaves_b = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert len(leaves_a) == len(leaves_b)
    for x, y in zip(leaves_a, leaves_b, strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=atol)


def test_storycloze_train_and_eval_loss_falls(tmp_path, cloze_path):
    config = tiny_config(**{
        "data.source": "file", "data.path": cloze_path, "tokenizer.lowercase": True,
        "model.n_tokens": 12, "model.dx": 8, "model.dt": 4, "num_steps": 20, "log_every": 5,
        "eval_every": 10, "checkpoint_every": 10, "optim.learning_rate": 3e-3, "batch_size": 16,
    })  # fmt: skip
    summary = train(config, str(tmp_path))
    metrics = read_metrics(str(tmp_path))
    train_losses = [r["loss"] for r in metrics["train"]]
    assert len(train_losses) == 4 and train_losses[-1] < train_losses[0] - 0.5, train_losses
    val = metrics["validation"]
    assert [r["step"] for r in val] == [10, 20] and val[-1]["window_ce"] < val[0]["window_ce"]
    assert summary["step"] == 20 and summary["data"]["train_stories"] == 1230  # 80% of 1,571 by story hash
    report = evaluate_run(str(tmp_path), split="test", num_examples=2, rollout_steps=2)  # past what the data holds
    assert report["windows"] == report["stories"] == report["cloze_stories"] == 156
    # the mean-CE rule by hand: each ending scored alone as S(T), the lower mean CE picked
    run = load_run(str(tmp_path), report["step"])
    stories, test_windows, _ = prepare_split(run.config, run.tokenizer, "test")
    pairs, labels = cloze_windows(stories, run.tokenizer, run.model_cfg.n_tokens, run.model_cfg.n_slices)
    score = jax.jit(lambda p, w: run.family.last_slice_ce(p, w, run.model_cfg))
    ce = np.asarray(score(run.params, pairs.reshape((-1,) + pairs.shape[2:]))).reshape(-1, 2)
    ties = int(np.sum(np.abs(ce[:, 0] - ce[:, 1]) < 1e-5))  # another program may order these either way
    assert abs(report["cloze_accuracy"] - np.mean(np.argmin(ce, axis=1) == labels)) <= ties / len(labels)
    # LS(T) by hand: each test window's mean CE over S(T), weighted by its tokens
    per_window = np.asarray(score(run.params, test_windows.windows), dtype=np.float64)
    tokens = np.sum(test_windows.windows[:, -1] != 0, axis=-1)
    assert report["last_slice_ce"] == pytest.approx(np.sum(per_window * tokens) / np.sum(tokens), rel=1e-5)
    assert len(report["examples"]) == 2
    assert report["rollout_stories"] == [156, 0] and report["rollout_mean_ce"][1] is None  # one more sentence each
    assert json.load(open(report["path"]))["step"] == report["step"]


def test_interrupted_run_resumes_to_identical_parameters(tmp_path):
    # with gradient accumulation: a step's microbatches are one program, so a signal lands between steps
    config = tiny_config(num_steps=6, checkpoint_every=4, eval_every=2, grad_accum_steps=2)
    full = train(config, str(tmp_path / "full"))
    assert full["step"] == 6 and full["interrupted"] is None

    def interrupt_at_5(step, state):
        if step == 5:
            signal.raise_signal(signal.SIGTERM)  # the real handler: save at once, then stop

    part = train(config, str(tmp_path / "split"), hooks=[interrupt_at_5])
    assert part["interrupted"] == "SIGTERM" and part["step"] == 5
    with RunCheckpoints(str(tmp_path / "split")) as ckpt:
        assert ckpt.all_steps() == [4, 5] and ckpt.latest_step() == 5
        assert ckpt.best_step() == 4 and part["best_step"] == 4  # 5 saved without a validation: never the best
    logged = read_metrics(str(tmp_path / "split"))["validation"]
    assert [r["step"] for r in logged] == [2, 4]  # no validation at the signal
    os.remove(tmp_path / "split" / "train_summary.json")  # as a killed first process leaves it: never written
    resumed = train(config, str(tmp_path / "split"))
    assert resumed["step"] == 6
    logged = read_metrics(str(tmp_path / "split"))["train"]  # both processes' intervals, each timed
    assert [r["step"] for r in logged] == [2, 4, 5, 6]  # 5: at the signal
    assert resumed["training_time_s"] == sum(r["interval_s"] for r in logged)  # the first process's included
    best = resumed["best_step"]
    assert resumed["training_time_to_best_s"] == sum(r["interval_s"] for r in logged if r["step"] <= best)
    a = load_run(str(tmp_path / "full"), "latest").params
    b = load_run(str(tmp_path / "split"), "latest").params
    _params_close(a, b, atol=1e-6)


def test_checkpoint_round_trip_with_iterator_state(tiny_run):
    config = tiny_config()  # the config tiny_run was trained with (6 steps)
    run = load_run(str(tiny_run), "latest")
    params, restored_config, tokenizer, step = run.params, run.config, run.tokenizer, run.step
    assert step == 6 and restored_config.model.dx == config.model.dx
    assert all(isinstance(x, np.ndarray) for x in jax.tree_util.tree_leaves(params))
    assert tokenizer.vocab_size == params["embed"]["sem"].shape[0]
    # the saved iterator state continues exactly where an uninterrupted iterator would
    from rank4jax.data.pipeline import train_dataset
    from rank4jax.engine.data_setup import prepare_data

    windows = prepare_data(config, tokenizer).windows["train"].windows
    reference = iter(train_dataset(windows, config.batch_size, seed=config.seed))
    for _ in range(6):
        next(reference)
    restored_iter = iter(train_dataset(windows, config.batch_size, seed=config.seed))
    with RunCheckpoints(str(tiny_run), read_only=True) as ckpt:  # the data_iter item: get_state() as JSON
        import orbax.checkpoint as ocp

        saved = ckpt.manager.restore(6, args=ocp.args.Composite(data_iter=ocp.args.JsonRestore()))["data_iter"]
    restored_iter.set_state(saved)
    np.testing.assert_array_equal(next(restored_iter), next(reference))


def test_params_restore_alone_equals_the_full_state_restore(tiny_run):
    """load_run reads the parameters only (a partial restore): the same values as the
    whole train state's restore."""
    from rank4jax.engine.sharding import with_shardings
    from rank4jax.runs import describe_run

    alone = load_run(str(tiny_run), "latest").params
    with RunCheckpoints(str(tiny_run), read_only=True) as ckpt:
        run = describe_run(ckpt, "latest")
        cpu = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
        state = ckpt.restore_state(
            run.step, with_shardings(run.abstract_state, jax.tree.map(lambda _: cpu, run.abstract_state))
        )
    _params_close(alone, state.params, atol=0)


def test_run_logs_norms_tensorboard_and_compiled_memory(tiny_run, tmp_path):
    import struct

    from tensorboardX.proto import event_pb2

    train_records = read_metrics(str(tiny_run))["train"]
    for r in train_records:  # L2 norms of parameters, gradients and updates with the loss
        assert all(np.isfinite(r[k]) and r[k] > 0 for k in ("grad_norm", "update_norm", "param_norm"))
    every = tiny_config(num_steps=3, log_every=1, eval_every=1, checkpoint_every=1, keep_checkpoints=3)
    train(every, str(tmp_path))  # a checkpoint every step: the logged update is the step's own change
    logged = {r["step"]: r["update_norm"] for r in read_metrics(str(tmp_path))["train"]}
    for step in (2, 3):
        before, after = (jax.tree.leaves(load_run(str(tmp_path), s).params) for s in (step - 1, step))
        change = np.sqrt(sum(np.sum((np.asarray(b, np.float64) - a) ** 2) for a, b in zip(before, after, strict=True)))
        assert logged[step] == pytest.approx(change, rel=1e-4)
    for step in (4, 6):  # the logged parameter norm is the saved parameters' (the step's own, not a mean)
        leaves = jax.tree.leaves(load_run(str(tiny_run), step).params)
        norm = np.sqrt(sum(np.sum(np.asarray(x, np.float64) ** 2) for x in leaves))
        assert next(r["param_norm"] for r in train_records if r["step"] == step) == pytest.approx(norm, rel=1e-6)
    summary = json.load(open(tiny_run / "train_summary.json"))
    memory = summary["compiled_train_step"]  # the AOT-compiled step's memory analysis
    parts = memory["argument_bytes"] + memory["output_bytes"] + memory["temp_bytes"] - memory["alias_bytes"]
    assert memory["total_bytes"] == parts and memory["compiled_shapes"] == 1  # one compact shape in 6 steps
    from rank4jax.checkpoint.storage import RunCheckpoints
    from rank4jax.runs import describe_run

    with RunCheckpoints(str(tiny_run), read_only=True) as ckpt:
        abstract = describe_run(ckpt, "latest").abstract_state
    state_bytes = sum(np.dtype(x.dtype).itemsize * int(np.prod(x.shape)) for x in jax.tree.leaves(abstract))
    assert memory["alias_bytes"] == state_bytes  # the donated train state, aliased whole to the new one
    assert memory["argument_bytes"] > state_bytes and memory["output_bytes"] > state_bytes  # and a batch, metrics
    # TensorBoard event files beside metrics.jsonl hold the same scalars
    (events_file,) = tiny_run.glob("events.out.tfevents.*")
    data, scalars, offset = events_file.read_bytes(), {}, 0
    while offset < len(data):  # TFRecord: length (u64), its crc, payload, payload crc
        (length,) = struct.unpack("<Q", data[offset : offset + 8])
        event = event_pb2.Event.FromString(data[offset + 12 : offset + 12 + length])
        offset += 16 + length
        for value in event.summary.value:
            scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    assert [s for s, _ in scalars["train/loss"]] == [r["step"] for r in train_records]
    np.testing.assert_allclose([v for _, v in scalars["train/loss"]], [r["loss"] for r in train_records], rtol=1e-6)
    val = read_metrics(str(tiny_run))["validation"]
    assert [s for s, _ in scalars["validation/window_ce"]] == [r["step"] for r in val] == [2, 4, 6]
    assert "train/param_norm" in scalars and "validation/token_accuracy" in scalars


def test_compiled_step_refuses_shapes_beyond_the_layout():
    import jax.numpy as jnp

    from rank4jax.engine.programs import CompiledStep

    def step(state, batch):
        return state + batch.sum()

    guarded = CompiledStep(jax.jit(step), max_shapes=2)
    assert float(guarded(jnp.float32(1), jnp.ones(3))) == 4.0
    guarded(jnp.float32(1), jnp.ones(4))
    guarded(jnp.float32(1), jnp.ones(3))  # compiled already: no new executable
    assert guarded.n_compiled == 2 and len(guarded.memory) == 2
    with pytest.raises(RuntimeError, match="beyond the 2 this batch layout can produce"):
        guarded(jnp.float32(1), jnp.ones(5))


def test_a_later_run_in_the_process_reuses_the_compiled_programs(tmp_path):
    """A second run with the same model, optimiser and mesh (another seed, another workdir) calls the
    programs built for the first (``training.programs``): JAX's own compile log records no compilation,
    not even from its persistent cache, and its step is still compiled ahead of time and measured."""
    from rank4jax.engine.programs import build_programs

    train(tiny_config(seed=7), str(tmp_path / "first"))
    hits = build_programs.cache_info().hits
    with compile_log() as compiles:
        summary = train(tiny_config(seed=8), str(tmp_path / "second"))
    assert compiles == []
    assert build_programs.cache_info().hits == hits + 1
    assert summary["step"] == 6 and summary["compiled_train_step"]["compiled_shapes"] == 1


def test_keeps_latest_and_best(tmp_path):
    config = tiny_config(num_steps=8, keep_checkpoints=1, **{"optim.learning_rate": 1e-2})
    summary = train(config, str(tmp_path))
    with RunCheckpoints(str(tmp_path)) as ckpt:
        steps = ckpt.all_steps()
        assert 8 in steps and summary["best_step"] in steps and len(steps) <= 2
    logged = {r["step"]: r["window_ce"] for r in read_metrics(str(tmp_path))["validation"]}
    assert summary["best_step"] == min(logged, key=logged.get)  # the best of every validation was kept


def test_rerun_after_completion_is_a_no_op(tiny_run_copy):
    before = (tiny_run_copy / "metrics.jsonl").read_text()
    again = train(tiny_config(), str(tiny_run_copy))
    assert again["step"] == 6 and again["wall_time_s"] == 0.0
    assert (tiny_run_copy / "metrics.jsonl").read_text() == before


def test_different_config_in_workdir_is_refused_and_nothing_changes(tiny_run_copy):
    def files():  # every file and its mtime, but the lock (the refused run held it while it checked)
        return sorted((p, os.path.getmtime(p)) for p in map(str, tiny_run_copy.rglob("*")) if not p.endswith("/.lock"))

    before = files()
    with pytest.raises(CheckpointError, match=r"different config: model.dx: checkpoint has 4, this run has 8"):
        train(tiny_config(num_steps=8, **{"model.dx": 8}), str(tiny_run_copy))
    assert files() == before
    assert (tiny_run_copy / ".lock").read_text() == ""  # released, no holder left behind


def test_divergence_stops_without_saving(tiny_run_copy):
    before = load_run(str(tiny_run_copy), "latest").params
    with RunCheckpoints(str(tiny_run_copy)) as ckpt:
        steps = ckpt.all_steps()
    config = tiny_config(num_steps=12, **{"optim.learning_rate": 1e38})  # optim may change on resume
    with pytest.raises(TrainingDivergedError, match="diverged at step ([7-9]|1[0-2]): loss=(nan|inf)"):
        train(config, str(tiny_run_copy))
    with RunCheckpoints(str(tiny_run_copy)) as ckpt:
        assert ckpt.all_steps() == steps and steps[-1] == 6
    after = load_run(str(tiny_run_copy), "latest").params
    _params_close(before, after, atol=0)


@pytest.mark.parametrize(
    "overrides,match",
    [
        ({"model.dropout": 1.0}, "model.dropout"),
        ({"model.dx": 0}, "model.dx"),
        ({"num_steps": -3}, "num_steps"),
        ({"checkpoint_every": 3}, "checkpoint_every"),
        ({"tokenizer.kind": "bytes"}, "tokenizer.kind"),
        ({"batch_size": 7}, "divisible"),
        ({"model.n_slices": 5}, r"n_slices=5 needs stories of at least T\+1=6 sentences"),
    ],
)
def test_bad_config_values(tmp_path, overrides, match):
    with pytest.raises(ConfigError, match=match):
        train(tiny_config(**overrides), str(tmp_path))
    assert not (tmp_path / "checkpoints").exists() or not any((tmp_path / "checkpoints").iterdir())


def test_missing_data_path(tmp_path):
    with pytest.raises(DataError, match=f"^data file not found: {tmp_path}/missing.csv"):
        train(tiny_config(**{"data.source": "file", "data.path": str(tmp_path / "missing.csv")}), str(tmp_path / "w"))
    assert not (tmp_path / "w").exists()  # refused before the workdir is made


def test_training_seconds_sum_the_logged_intervals_of_every_start():
    records = [  # a record from before interval_s was logged: 2 steps × 8 windows at 8 windows/s
        {"step": 2, "interval_s": 3.0, "windows_per_s": 1.0},
        {"step": 4, "windows_per_s": 8.0},
        {"step": 6, "interval_s": 0.5, "windows_per_s": 99.0},
    ]
    assert training_seconds(records, batch_size=8) == 5.5
    assert training_seconds(records, batch_size=8, until_step=4) == 5.0
    assert training_seconds(records, batch_size=8, until_step=3) == 3.0
    assert training_seconds([], batch_size=8) == 0.0


def test_the_logged_training_time_leaves_the_compilation_out(tmp_path, monkeypatch):
    """The first interval starts once the train step is compiled: a compile that took 10⁶ s (a
    clock moved on by that much while it ran) is not in the run's training time."""
    import time

    from rank4jax.training import loop

    offset, real_clock, compile_first = [0.0], time.perf_counter, loop._compile_on_first_batch

    def slow_compile(*args):
        batch = compile_first(*args)
        offset[0] += 1e6
        return batch

    monkeypatch.setattr(time, "perf_counter", lambda: real_clock() + offset[0])
    monkeypatch.setattr(loop, "_compile_on_first_batch", slow_compile)
    summary = train(tiny_config(), str(tmp_path))
    assert offset[0] == 1e6 and summary["training_time_s"] < 1e5
    assert all(r["interval_s"] < 1e5 for r in read_metrics(str(tmp_path))["train"])


def test_plot_command(tiny_run_copy):
    from tests import launcher

    (tiny_run_copy / "plots" / "curves.png").unlink()
    out = launcher.run("-m", "rank4jax.training.metrics", str(tiny_run_copy), timeout=120)
    assert out.returncode == 0 and (tiny_run_copy / "plots" / "curves.png").is_file()
    out = launcher.run("-m", "rank4jax.training.metrics", str(tiny_run_copy / "none"))
    assert out.returncode == 2 and "error: no metrics" in out.stderr


def _expected_early_stop(losses: list[tuple[int, float]], patience: int) -> tuple[int, int] | None:
    """(stop step, best step) by hand from a validation curve: the first validation that is the
    ``patience``-th in a row not below the lowest before it."""
    best, best_step, since = float("inf"), None, 0
    for step, loss in losses:
        best, best_step, since = (loss, step, 0) if loss < best else (best, best_step, since + 1)
        if since == patience:
            return step, best_step
    return None


def test_early_stopping_stops_at_the_right_validation_and_a_resumed_run_stops_there_too(tmp_path):
    """A noisy run (lr 0.5) validated every 2 steps: without early stopping its curve has a
    validation worse than the best before it; with patience 1 the run stops there, keeps the best
    checkpoint, and a run interrupted before that step and resumed stops at the same step with the
    same parameters; rerunning a stopped run trains nothing."""
    config = tiny_config(num_steps=16, seed=1, **{"optim.learning_rate": 0.5})  # worse at step 6
    train(config, str(tmp_path / "free"))
    curve = [(r["step"], r["window_ce"]) for r in read_metrics(str(tmp_path / "free"))["validation"]]
    expected = _expected_early_stop(curve, patience=1)
    assert expected is not None and expected[0] < 16, curve  # the curve does get worse once
    stop_step, best_step = expected
    config.early_stop_patience = 1
    stopped = train(config, str(tmp_path / "stopped"))
    assert (stopped["step"], stopped["best_step"], stopped["early_stopped"]) == (stop_step, best_step, True)
    assert [r["step"] for r in read_metrics(str(tmp_path / "stopped"))["validation"]][-1] == stop_step

    def interrupt(step, state):
        if step == stop_step - 1:
            signal.raise_signal(signal.SIGTERM)

    assert train(config, str(tmp_path / "resumed"), hooks=[interrupt])["interrupted"] == "SIGTERM"
    resumed = train(config, str(tmp_path / "resumed"))
    assert (resumed["step"], resumed["best_step"], resumed["early_stopped"]) == (stop_step, best_step, True)
    _params_close(
        load_run(str(tmp_path / "stopped"), "latest").params,
        load_run(str(tmp_path / "resumed"), "latest").params,
        atol=0,
    )
    again = train(config, str(tmp_path / "stopped"))
    assert (again["step"], again["wall_time_s"], again["early_stopped"]) == (stop_step, 0.0, True)


def test_early_stopping_state_is_rebuilt_from_the_best_checkpoint():
    from rank4jax.training.early_stopping import EarlyStopping

    assert EarlyStopping.resume(3, None, 40, 10) == EarlyStopping(3)  # nothing validated yet
    state = EarlyStopping.resume(3, (20, 1.5), 40, 10)  # validations at 30 and 40 did not improve
    assert (state.best, state.best_step, state.since, state.stopped) == (1.5, 20, 2, False)
    assert state.update(50, 1.5) and state.since == 3  # equal is no improvement
    assert not EarlyStopping.resume(3, (20, 1.5), 45, 10).update(50, 1.49)
    assert not EarlyStopping(0).update(10, 9.0) and not EarlyStopping(0, 1.0, 5, 100).stopped  # 0 = off


@pytest.mark.parametrize("when", ["during", "before"])
def test_a_signal_at_the_last_validation_keeps_that_steps_metric(when, tiny_run, tmp_path, monkeypatch):
    """SIGTERM while the last step validates, or just before its validation: the run stops there
    (status SIGTERM) and its checkpoint carries the validation loss, so the run selects the same best
    step as the uninterrupted one."""
    from rank4jax.training.actions import PeriodicActions

    real = PeriodicActions.validate

    def signalled_validate(self, step, state):
        if step == 6:
            signal.raise_signal(signal.SIGTERM)  # the real handler: a flag, checked after the pass
        real(self, step, state)

    def signal_after_step_6(step, state):
        if step == 6:
            signal.raise_signal(signal.SIGTERM)

    if when == "during":
        monkeypatch.setattr(PeriodicActions, "validate", signalled_validate)
    hooks = [signal_after_step_6] if when == "before" else []
    summary = train(tiny_config(), str(tmp_path), hooks=hooks)
    assert (summary["step"], summary["interrupted"]) == (6, "SIGTERM")
    with RunCheckpoints(str(tmp_path)) as ckpt, RunCheckpoints(str(tiny_run), read_only=True) as reference:
        assert ckpt.manager.metrics(6) == reference.manager.metrics(6)  # the same loss, saved with step 6
        assert ckpt.best_step() == reference.best_step() == summary["best_step"]
    assert read_metrics(str(tmp_path))["validation"][-1]["step"] == 6


def test_a_lock_file_removed_under_a_running_run_stops_it_before_it_writes(tmp_path):
    """``rm .lock`` while a run holds it (a second run could then take the workdir): the holder stops
    at its next save with one error, and writes nothing more."""
    from rank4jax.errors import WorkdirError

    def remove_lock(step, state):
        if step == 3:
            os.remove(tmp_path / ".lock")

    with pytest.raises(WorkdirError, match=r"lock file .*\.lock was removed or replaced .* without saving step 4"):
        train(tiny_config(), str(tmp_path), hooks=[remove_lock])
    with RunCheckpoints(str(tmp_path), read_only=True) as ckpt:
        assert ckpt.all_steps() == [2]


@pytest.mark.parametrize("removed", [("6",), ("4", "6")], ids=["from_4", "from_0"])
def test_a_resume_rewinds_metrics_to_its_checkpoint(tiny_run_copy, removed):
    """A run resumed from step 4 (checkpoint 6 gone), or started again from 0 (every checkpoint gone:
    a run killed before its first save), after a crash that cut the last line short: the log holds
    each step once and every line reads."""
    import shutil

    for step in removed:
        shutil.rmtree(tiny_run_copy / "checkpoints" / step)
    with open(tiny_run_copy / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write('{"step": 8, "split": "train", "loss": 1.0}\n{"step": 9, "spl')  # beyond, then cut short
    train(tiny_config(), str(tiny_run_copy))
    lines = (tiny_run_copy / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]  # every line reads
    steps = [(r["split"], r["step"]) for r in records]
    assert sorted(steps) == sorted({*steps}) == sorted((s, n) for s in ("train", "validation") for n in (2, 4, 6))


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_the_schedules_rates_equal_optaxs(schedule):
    import optax

    from rank4jax.engine.state import learning_rate_schedule

    config = tiny_config(**{"optim.schedule": schedule, "optim.warmup_steps": 10, "optim.end_lr_factor": 0.1})
    lr = config.optim.learning_rate
    decay = {
        "cosine": optax.cosine_decay_schedule(lr, 90, alpha=0.1),
        "linear": optax.linear_schedule(lr, 0.1 * lr, 90),
    }[schedule]
    expected = optax.join_schedules([optax.linear_schedule(0.0, lr, 10), decay], [10])
    ours = learning_rate_schedule(config.optim, num_steps=100)
    for step in (0, 5, 10, 11, 55, 99, 100, 150):
        assert float(ours(step)) == float(expected(step))
    assert float(ours(100)) == pytest.approx(0.1 * lr, rel=1e-6)


def test_the_logged_learning_rate_is_the_schedules_at_each_logged_step(tmp_path):
    from rank4jax.engine.state import learning_rate_schedule

    config = tiny_config(**{"optim.schedule": "cosine", "optim.warmup_steps": 2})
    train(config, str(tmp_path))
    schedule = learning_rate_schedule(config.optim, config.num_steps)
    logged = {r["step"]: r["learning_rate"] for r in read_metrics(str(tmp_path))["train"]}
    assert logged == {s: float(schedule(s - 1)) for s in (2, 4, 6)}  # step s updates with the rate at count s-1


def test_each_run_writes_its_resolved_config_beside_its_summary(tiny_run):
    with RunCheckpoints(str(tiny_run), read_only=True) as ckpt:
        saved, _ = ckpt.load_meta(ckpt.latest_step())
    with open(os.path.join(tiny_run, "config.json"), encoding="utf-8") as f:
        assert json.load(f) == saved  # overrides, the measured batch layout and the data fingerprint included


def test_a_finished_run_rerun_with_another_rate_keeps_the_config_it_was_trained_with(tiny_run_copy):
    workdir = str(tiny_run_copy)
    before = open(os.path.join(workdir, "config.json")).read()
    config = tiny_config(plots=True, **{"optim.learning_rate": 0.5})  # tiny_run's config but for the rate
    assert train(config, workdir)["step"] == config.num_steps  # nothing trained
    assert open(os.path.join(workdir, "config.json")).read() == before


def test_an_event_file_that_cannot_be_written_is_one_warning_and_the_log_goes_on(tmp_path, monkeypatch, capsys):
    from rank4jax.training.metrics import EventFile, MetricsWriter

    def full_disk(self, scalars, step):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(EventFile, "add_scalars", full_disk)
    with MetricsWriter(str(tmp_path)) as writer:
        for step in (1, 2):
            writer.write({"step": step, "split": "train", "loss": 2.5, "windows_per_s": 8.0})
    assert [r["step"] for r in read_metrics(str(tmp_path))["train"]] == [1, 2]
    assert capsys.readouterr().err == (
        f"rank4jax: warning: the TensorBoard event file in {tmp_path} stops here: No space left on device\n"
    )


def test_a_damaged_metrics_log_is_read_around_its_bad_lines(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    good = [
        {"step": 1, "split": "train", "loss": 2.0, "windows_per_s": 8.0},
        {"step": 2, "split": "validation", "window_ce": 1.5, "last_slice_ce": 2.5},
    ]
    path.write_bytes(
        (json.dumps(good[0]) + '\n3\n\xff\xfe garbage\n{"split": "train"}\n' + json.dumps(good[1]) + "\n").encode(
            "latin-1"
        )
        + b'{"step": 3, "spl'  # the last line, cut short by a hard kill: skipped without a word
    )
    assert read_metrics(str(tmp_path)) == {"train": [good[0]], "validation": [good[1]]}
    assert capsys.readouterr().err == f"rank4jax: warning: {path}: 4 unreadable line(s) skipped\n"
    path.write_text(json.dumps(good[0]) + '\n{"step": 3, "spl')
    assert read_metrics(str(tmp_path)) == {"train": [good[0]]} and capsys.readouterr().err == ""
