"""The batch layout chosen by measurement at start-up: timed, logged, saved with the
checkpoints and kept on resume; named or ruled layouts are not measured."""

import contextlib

import numpy as np
import pytest

from rank4jax.checkpoint.storage import RunCheckpoints
from rank4jax.engine.batches import batch_layout, candidate_layouts
from rank4jax.engine.run_config import validate
from rank4jax.errors import ConfigError
from rank4jax.evaluation.report import restore_for_evaluation
from rank4jax.models.family import RANK4
from rank4jax.training import layout_choice
from rank4jax.training.loop import train
from rank4jax.training.setup import prepare_run
from tests.helpers import tiny_config


def test_candidates_follow_the_config_and_a_named_layout_must_be_one():
    config = tiny_config()
    model_cfg = RANK4.make_config(config.model, 50)
    assert candidate_layouts(config, RANK4, model_cfg) == ["compact", "trimmed", "full"]
    config.compact_buckets, config.trim_padding_multiple = 0, 0
    assert candidate_layouts(config, RANK4, model_cfg) == ["full"]
    assert batch_layout(config, RANK4, model_cfg, groups=1).name == "full"  # the rule: the first
    with pytest.raises(ConfigError, match="batch_layout 'compact' is not available to this run"):
        batch_layout(config, RANK4, model_cfg, groups=1, name="compact")
    with pytest.raises(ConfigError, match="batch_layout must be one of auto, rule, compact, trimmed, full"):
        validate(tiny_config(batch_layout="fastest"))


def test_auto_times_every_candidate_keeps_the_fastest_and_a_resume_keeps_it(tmp_path, monkeypatch, capsys):
    """The measured figures decide (here made up, trimmed fastest, through the timing function's
    result): the log names the choice and its figures, the summary and the checkpoints carry it, and
    a resume uses it without measuring again."""
    measured = []

    def timed(layouts, steps, programs, windows, batch_size, seed):
        assert sorted(steps) == sorted(layouts)
        measured.append(sorted(layouts))
        return {"compact": 0.003, "trimmed": 0.002, "full": 0.004}

    monkeypatch.setattr(layout_choice, "time_layouts", timed)
    config = tiny_config(batch_layout="auto", num_steps=4)
    assert train(config, str(tmp_path))["batch_layout"] == "trimmed"
    assert measured == [["compact", "full", "trimmed"]]
    out = capsys.readouterr().err
    assert (
        "rank4jax: batch layout trimmed, the fastest measured (ms per train step: trimmed 2.0, compact 3.0, full 4.0)"
        in out
    )
    with RunCheckpoints(str(tmp_path), read_only=True) as ckpt:
        assert ckpt.load_meta(4)[0]["batch_layout"] == "trimmed"
    config.num_steps = 6
    assert train(config, str(tmp_path))["batch_layout"] == "trimmed"
    assert measured == [["compact", "full", "trimmed"]]  # not measured again
    assert restore_for_evaluation(str(tmp_path))[2].layout.name == "trimmed"  # evaluation keeps it too


def test_the_timing_runs_each_layout_on_the_same_batches(tmp_path, monkeypatch):
    """The real steps on a tiny model: every candidate is given the same BATCHES batches of the run's
    training windows, runs them once to compile and ROUNDS times timed (candidates interleaved, the
    throwaway state donated from step to step); with a clock that ticks once per read, each timed pass
    reads as one tick over its BATCHES steps, so each median is exactly 1 / BATCHES."""
    import itertools
    import types

    ticks = itertools.count()
    monkeypatch.setattr(layout_choice, "time", types.SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    with contextlib.ExitStack() as stack:  # the run's lock and checkpoint manager, released at the end
        _time_layouts_recorded(prepare_run(tiny_config(), str(tmp_path), stack))


def _time_layouts_recorded(run):
    train_windows = run.data.windows["train"].windows
    given, steps = {}, []

    def recording(name):
        layout = batch_layout(run.config, run.family, run.model_cfg, run.programs.mesh.shape["data"], name)

        def record(windows):
            given.setdefault(name, []).append(windows)
            return layout(windows)

        return record

    def counted_step(state, batch):
        steps.append(int(state.step))
        return run.programs.train_step(state, batch)

    layouts = {name: recording(name) for name in ("compact", "full")}
    seconds = layout_choice.time_layouts(
        layouts, dict.fromkeys(layouts, counted_step), run.programs, train_windows, 8, 0
    )
    batches = layout_choice.BATCHES
    assert seconds == {"compact": 1 / batches, "full": 1 / batches}
    assert [len(given[name]) for name in ("compact", "full")] == [batches, batches]  # laid out once each
    for a, b in zip(given["compact"], given["full"], strict=True):
        np.testing.assert_array_equal(a, b)
        assert a.shape == (8,) + train_windows.shape[1:] and all(any((w == t).all() for t in train_windows) for w in a)
    calls = 2 * batches * (layout_choice.ROUNDS + 1)
    assert steps == list(range(calls))  # one state carried through every call
