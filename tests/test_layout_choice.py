"""The batch layout chosen by measurement at start-up (issue 28): timed, logged, saved with the
checkpoints and kept on resume; named or ruled layouts are not measured."""

import json

import pytest

from rank4jax.checkpoint.storage import RunCheckpoints
from rank4jax.errors import ConfigError
from rank4jax.models.family import RANK4
from rank4jax.training import layout_choice
from rank4jax.training.batches import batch_layout, candidate_layouts
from rank4jax.training.loop import train
from rank4jax.training.run_config import validate
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

    def timed(layouts, programs, windows, batch_size, seed):
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
    with open(tmp_path / "eval_layout.json", "w") as f:  # evaluation keeps it too
        from rank4jax.evaluation.report import restore_for_evaluation

        json.dump(restore_for_evaluation(str(tmp_path))[2].layout.name, f)
    assert json.loads((tmp_path / "eval_layout.json").read_text()) == "trimmed"


def test_the_timing_runs_each_layout_on_the_same_batches(tmp_path):
    """The real measurement on a tiny model: a median time per candidate, every one positive."""
    import contextlib

    from rank4jax.training.setup import prepare_run

    config = tiny_config(batch_layout="auto")
    with contextlib.ExitStack() as stack:
        run = prepare_run(config, str(tmp_path), stack)
        groups = run.programs.mesh.shape["data"]
        layouts = {name: batch_layout(config, run.family, run.model_cfg, groups, name) for name in ("compact", "full")}
        seconds = layout_choice.time_layouts(layouts, run.programs, run.data.windows["train"].windows, 8, 0)
    assert sorted(seconds) == ["compact", "full"] and all(s > 0 for s in seconds.values())
