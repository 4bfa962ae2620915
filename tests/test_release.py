"""A released run (``rank4jax.runs.release_run``: the parameters, config and tokenizer of one
checkpoint, no optimiser state) loads, predicts and evaluates as its workdir did; training refuses to
resume from it and changes nothing."""

import os

import jax
import numpy as np
import pytest

from rank4jax.errors import CheckpointError
from rank4jax.evaluation.report import evaluate_run
from rank4jax.runs import load_run, release_run
from rank4jax.training.loop import train
from tests.helpers import tiny_config


def test_a_released_run_reads_as_its_workdir_and_refuses_to_resume(tiny_run, tmp_path):
    out = tmp_path / "released"
    assert release_run(str(tiny_run), str(out)) == load_run(str(tiny_run)).step
    assert sorted(os.listdir(out)) == ["checkpoints", "config.json", "metrics.jsonl", "train_summary.json"]
    (step,) = os.listdir(out / "checkpoints")
    assert {"config", "params", "tokenizer"} <= set(os.listdir(out / "checkpoints" / step)) and not (
        out / "checkpoints" / step / "opt_state"
    ).exists()
    for a, b in zip(jax.tree.leaves(load_run(str(out)).params), jax.tree.leaves(load_run(str(tiny_run)).params),
                    strict=True):  # fmt: skip
        np.testing.assert_array_equal(a, b)
    options = {"split": "validation", "num_examples": 0, "rollout_steps": 0}
    assert evaluate_run(str(out), **options)["last_slice_ce"] == evaluate_run(str(tiny_run), **options)["last_slice_ce"]
    before = sorted(os.listdir(out))
    with pytest.raises(CheckpointError, match="holds a released run's parameters only .* nothing was changed"):
        train(tiny_config(num_steps=8), str(out))
    assert sorted(os.listdir(out)) == before and os.listdir(out / "checkpoints") == [step]
    with pytest.raises(CheckpointError, match="exists: a release is written into a new folder"):
        release_run(str(tiny_run), str(out))
