"""Every reported figure from a record: README's, docs/scaling.md's and results/README.md's tables are
what ``rank4jax.experiments.results`` renders from ``results/`` (an edited record makes them differ); the
released D = 64 rank-4 run evaluates to its record's (and README's) test LS(T) and context gain."""

import json
import os
import shutil

import pytest

from rank4jax.evaluation.report import evaluate_run
from rank4jax.experiments import results
from tests.conftest import REPO

ROCSTORIES = REPO.parent / "shared" / "data" / "rocstories_spring2016_first45000.csv"


def test_the_tables_are_their_records_and_an_edited_record_shows(tmp_path):
    assert results.render(str(REPO), check=True) == []
    for name in ("README.md", "docs", "results"):
        copy = shutil.copytree if (REPO / name).is_dir() else shutil.copy
        copy(REPO / name, tmp_path / name)
    path = tmp_path / "results" / "runs" / "d64-rank4-released.json"
    record = json.loads(path.read_text())
    record["ls"] += 0.001
    path.write_text(json.dumps(record))
    assert results.render(str(tmp_path), check=True) == ["README.md", "docs/scaling.md"]
    assert results.render(str(tmp_path)) == ["README.md", "docs/scaling.md"]  # rewritten: now they agree
    assert results.render(str(tmp_path), check=True) == []
    assert f"{record['ls']:.4f}" in (tmp_path / "README.md").read_text()


def test_the_records_hold_what_each_figure_needs():
    records, pairs = results.load(str(REPO))
    for record in records.values():
        assert {"family", "width", "seed", "learning_rate", "commit", "machine", "best_step", "stopped_step", "ls",
                "context_gain", "source"} <= set(record), record["name"]  # fmt: skip
    released = [r for r in records.values() if r["source"].startswith("released/")]
    assert {f"d64-{family}-released" for family in ("rank4", "baseline", "flat")} <= {r["name"] for r in released}
    for record in released:  # their per-story outcomes, and the run itself in the repository
        outcomes = record["cloze_outcomes"]
        assert {len(v) for v in outcomes.values()} == {1571} and os.path.isdir(REPO / record["source"])
    assert all({pair["a"], pair["b"]} <= set(records) for pair in pairs)


@pytest.mark.skipif(not ROCSTORIES.is_file(), reason=f"the shared ROCStories data is not at {ROCSTORIES}")
def test_the_released_rank4_run_gives_its_figures(tmp_path, monkeypatch):
    """``eval.py --workdir=released/d64/rank4 --split=test`` as in-process (in a copy: the repository's
    reports stay as released): README's D = 64 LS(T) and context gain to the printed digit."""
    records = results.load(str(REPO))[0]
    record, baseline = records["d64-rank4-released"], records["d64-baseline-released"]
    copy = tmp_path / "rank4"
    shutil.copytree(REPO / "released" / "d64" / "rank4", copy, ignore=shutil.ignore_patterns("eval"))
    monkeypatch.chdir(REPO)  # the run's data path is relative to the repository root, as the command runs
    report = evaluate_run(str(copy), split="test", num_examples=0, rollout_steps=0)
    assert f"{report['last_slice_ce']:.4f}" == f"{record['ls']:.4f}"
    assert f"{report['context_gain']:.3f}" == f"{record['context_gain']:.3f}"
    row = f"| {report['last_slice_ce']:.4f} | {baseline['ls']:.4f} | {baseline['ls'] - report['last_slice_ce']:+.3f} | "
    assert row + f"{report['context_gain']:.3f} / {baseline['context_gain']:.3f} |" in (REPO / "README.md").read_text()
