"""bench.paper_comparison, the GPU command of the paper's comparison: its tiny form end to end on the CPU,
and every program it runs at the paper's size lowered for CUDA and TPU (no accelerator needed)."""

import json

import jax
import numpy as np
import pytest

from bench import paper_comparison
from rank4jax.data.compact import compact_windows
from rank4jax.data.windows import trim_padding
from rank4jax.engine import sharding
from rank4jax.engine.programs import StepPolicy, build_programs, optim_key
from rank4jax.experiments import ladder as lad
from rank4jax.models.family import get_family


def test_the_tiny_form_trains_both_families_to_a_budget_and_reports_the_comparison(tmp_path):
    out = tmp_path / "out"
    args = ["--tiny", f"--out={out}", f"--workdir={tmp_path / 'runs'}", "--budget_s=0.5", "--validations=2"]
    result = paper_comparison.main(args)
    assert set(result["plan"]) == {"d8/rank4", "d8/baseline"}
    for plan in result["plan"].values():  # the probe, then two validated intervals of at least the probe's length
        assert plan["probe_steps"] == 4 and plan["steps"] >= 4 + 2 * 4 and plan["ms_per_step_probe"] > 0
    rows = result["result"]["rows"]
    assert rows["d8/rank4"]["stopped_step"] == result["plan"]["d8/rank4"]["steps"]
    delta = result["result"]["rungs"][8]["delta_baseline"]
    assert delta == pytest.approx(rows["d8/baseline"]["ls"] - rows["d8/rank4"]["ls"], abs=1e-12)
    text = (out / "paper_comparison.md").read_text()
    assert "--budget_s=0.5 s of wall time after a 4-step probe" in text and "| 8 | baseline |" in text
    assert "device cpu;" in text and "lease" not in text
    assert json.loads((out / "paper_comparison.json").read_text())["plan"] == result["plan"]


@pytest.mark.parametrize(
    "flag,message",
    [("--validations=0", "--validations must be a positive integer"), ("--budget_s=nan", "--budget_s must be a pos"),
     ("--out=FILE", "is a file, not a directory")],
)  # fmt: skip
def test_bad_flags_are_one_line_before_anything_runs(flag, message, tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit) as exit_:
        flag = flag.replace("FILE", str(tmp_path / "file"))
        paper_comparison.main(["--tiny", f"--workdir={tmp_path / 'runs'}", flag])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def _programs(family, config, vocab):
    """The run's programs at ``config``'s size, with one abstract batch per layout the family accepts."""
    model_cfg = family.make_config(config.model, vocab)
    policy = StepPolicy(config.compute_dtype)
    programs = build_programs(family, model_cfg, optim_key(config.optim, 1000), sharding.make_mesh(1, 1), policy)
    windows = np.random.default_rng(0).integers(4, vocab, (config.batch_size, config.model.n_slices + 1, 16))
    windows[:, :, 13:] = 0
    windows = windows.astype(np.int32)
    accepted = family.layouts(model_cfg)
    layouts = {"full": windows}
    if "trimmed" in accepted:
        layouts["trimmed"] = trim_padding(windows, 1)
    if "compact" in accepted:
        layouts["compact"] = compact_windows(windows, groups=1, buckets=16)
    return programs, jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), layouts), windows


@pytest.mark.parametrize("family_name", ["rank4", "baseline"])
def test_every_program_lowers_for_cuda_and_tpu_at_the_papers_size(family_name):
    """The train step of each layout, the eval step, the scorer and the prediction (the baseline's
    free-running decode) at dx = 64, dt = 32, H = 4, L = 2, bf16, V = 14,171 (the ladder's vocabulary)."""
    vocab = 14_171
    rank4 = paper_comparison.paper_config("data", tiny=False)
    config = rank4 if family_name == "rank4" else lad.matched_config(rank4, "baseline", vocab)
    family = get_family(family_name)
    programs, layouts, windows = _programs(family, config, vocab)
    state, params = programs.abstract, programs.abstract.params
    full = jax.ShapeDtypeStruct(windows.shape, windows.dtype)
    traced = {f"train_step/{name}": programs.train_step.trace(state, batch) for name, batch in layouts.items()}
    traced |= {f"eval_step/{name}": programs.eval_step.trace(params, batch) for name, batch in layouts.items()}
    traced |= {
        "score": programs.score.trace(params, full),
        "predict_and_score": programs.predict_and_score.trace(params, full),
        "init": programs.init.trace(jax.random.key(0)),
    }
    assert family_name == "baseline" or "train_step/compact" in traced
    for name, program in traced.items():
        for platform in ("cuda", "tpu"):
            text = program.lower(lowering_platforms=(platform,)).as_text()
            assert "func.func public @main" in text, (name, platform)
