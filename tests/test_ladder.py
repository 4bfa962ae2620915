"""The size ladder: its configs, rate pick, matching and report, on one shared tiny run."""

import json
import math
import os

import pytest
from helpers import tiny_config

from rank4jax.engine.data_setup import prepare_data
from rank4jax.errors import ConfigError
from rank4jax.experiments import ladder as lad
from rank4jax.experiments import ladder_report as rep
from rank4jax.experiments import ladder_stats as lstats
from rank4jax.models.family import run_param_count
from rank4jax.training.metrics import read_metrics, steady_ms_per_step


def test_fiber_widths_and_refusals():
    assert [lad.fiber(w) for w in (8, 64, 128, 256, 512)] == [(4, 2), (8, 8), (16, 8), (16, 16), (32, 16)]
    with pytest.raises(ConfigError, match="power of two"):
        lad.fiber(96)
    with pytest.raises(ConfigError, match="sweep_steps must be a positive integer, got 0"):
        lad.check_plan(lad.LadderPlan(sweep_steps=0))
    with pytest.raises(ConfigError, match=r"learning rates must be positive, finite and at least one, got \(inf,\)"):
        lad.check_plan(lad.LadderPlan(rates=(math.inf,)))


def test_settings_that_only_the_evaluation_reads_are_refused_before_any_training(tmp_path):
    with pytest.raises(ConfigError, match="--cloze_contexts must be a non-negative integer"):
        lad.evaluator("test", None, -1)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match=f"--workdir={tmp_path}/file is not a directory"):
        lad.status(tiny_config(), str(tmp_path / "file"), lad.LadderPlan())
    own = tiny_config(**{"data.source": "file", "data.path": str(tmp_path / "file")})
    with pytest.raises(ConfigError, match="is the models' own training data"):  # as compare.py refuses it
        lad.evaluator("test", str(tmp_path / "file"), 8, config=own)


def test_linear_fit_refuses_what_has_no_slope():
    """A NaN Δ (a diverged rung) and rungs of one size are refused by name (was scipy's error or a
    crossing at NaN); three equal Δs are a flat, perfect fit: no spread to report."""
    for x, y in (([1.0, 2.0, 3.0], [0.1, float("nan"), 0.2]), ([5.0, 5.0], [0.1, 0.2])):
        with pytest.raises(ValueError, match="linear_fit"):
            lstats.linear_fit(x, y)
    flat = lstats.linear_fit([1.0, 2.0, 3.0], [0.1, 0.1, 0.1])
    assert flat["b"] == 0.0 and flat["se_b"] is None and flat["p_no_trend"] is None


def test_linear_fit_and_crossing_by_hand():
    fit = lstats.linear_fit([0.0, 1.0, 2.0], [1.0, 2.0, 4.0])  # b = 1.5, a = 5/6, residuals ±1/6, -1/3
    assert fit["b"] == pytest.approx(1.5, abs=1e-15) and fit["a"] == pytest.approx(5 / 6, abs=1e-15)
    assert fit["se_b"] == pytest.approx(math.sqrt((1 / 36 + 1 / 9 + 1 / 36) / 1 / 2), abs=1e-15)
    # one degree of freedom: Student's t is Cauchy, quantile tan(π(q − ½)), two-sided p = 1 − 2·atan(t)/π
    half = math.tan(math.pi * 0.475) * fit["se_b"]
    assert fit["b_interval"] == pytest.approx([1.5 - half, 1.5 + half], abs=1e-12)
    assert {type(v) for v in (*fit["b_interval"], fit["p_no_trend"])} == {float}  # ladder.json: plain numbers
    assert fit["p_no_trend"] == pytest.approx(1 - 2 * math.atan(1.5 / fit["se_b"]) / math.pi, abs=1e-12)
    rows = {  # Δ = -0.2 at 10^5 parameters, -0.1 at 10^6: zero at 10^7
        "d8/rank4": {"width": 8, "family": "rank4", "params": 10**5, "ls": 5.0},
        "d8/baseline": {"width": 8, "family": "baseline", "params": 10**5, "ls": 4.8},
        "d16/rank4": {"width": 16, "family": "rank4", "params": 10**6, "ls": 4.0},
        "d16/baseline": {"width": 16, "family": "baseline", "params": 10**6, "ls": 3.9},
    }
    for width, ls in ((8, 4.0), (16, 3.0)):  # teacher-forced LS(T)
        rows[f"d{width}/baseline_lm"] = {
            "width": width,
            "family": "baseline_lm",
            "params": 10 ** (width // 8 + 4),
            "ls": ls,
        }
    assert set(lstats.delta_trend(rows)) == {"baseline"}  # no Δ between a teacher-forced LS(T) and a free-running one
    assert set(lstats._rung_tests({"rank4": rows["d8/rank4"], "baseline_lm": rows["d8/baseline_lm"]})) == set()
    trend = lstats.delta_trend(rows)["baseline"]
    assert trend["b"] == pytest.approx(0.1, abs=1e-12) and trend["crossing_params"] == pytest.approx(1e7, rel=1e-9)
    assert trend["crossing"] == "ahead" and trend["se_b"] is None  # two rungs: no uncertainty
    assert "it would reach 0 at about 10,000,000 rank-4 parameters if the trend held" in rep.trend_sentence(
        "baseline", trend
    )
    rows["d16/baseline"]["ls"] = 3.7  # Δ -0.2 → -0.3: away from zero (the fit's zero at 10^3)
    trend = lstats.delta_trend(rows)["baseline"]
    assert trend["crossing"] == "behind" and trend["crossing_params"] == pytest.approx(1e3, rel=1e-9)
    assert "the fit moves Δ away from zero as size grows" in rep.trend_sentence("baseline", trend)
    rows["d16/baseline"]["ls"] = 4.2  # Δ -0.2 → +0.2: sign changes between the rungs, at 10^5.5
    trend = lstats.delta_trend(rows)["baseline"]
    assert trend["crossing"] == "inside" and trend["crossing_params"] == pytest.approx(10**5.5, rel=1e-9)
    assert "changes sign within the ladder, at about 316,228 rank-4 parameters" in rep.trend_sentence("baseline", trend)
    rows["d16/baseline"]["ls"] = 3.8  # Δ -0.2 at both rungs: a flat fit has no zero
    trend = lstats.delta_trend(rows)["baseline"]
    assert trend["crossing"] is None and trend["crossing_params"] is None
    assert rep.trend_sentence("baseline", trend) == (
        "Δ (baseline) against log10(rank-4 parameters): slope +0.0000 (from 2 rungs: no uncertainty) per decade; "
        "the fit is flat."
    )


def test_the_reported_trend_to_the_printed_digit():
    """scipy's fit of docs/scaling.md's reported rungs equals the textbook least-squares formulas to 1e-12,
    so the sentence prints the same digits (from the table's rounded LS(T): slope −0.1319 ± 0.0526; the
    report's −0.1318 ± 0.0527 came from the unrounded values)."""
    from scipy import stats

    reported = {64: (456_072, 5.6052, 5.6946), 128: (914_784, 5.6850, 5.6986), 256: (2_520_336, 5.7391, 5.7264)}
    rows = {}
    for width, (params, rank4, baseline) in reported.items():
        rows[f"d{width}/rank4"] = {"width": width, "family": "rank4", "params": params, "ls": rank4}
        rows[f"d{width}/baseline"] = {"width": width, "family": "baseline", "params": 478_688, "ls": baseline}
    fit = lstats.delta_trend(rows)["baseline"]
    x = [math.log10(p) for p, _, _ in reported.values()]
    y = [b - r for _, r, b in reported.values()]
    mx, my = sum(x) / 3, sum(y) / 3
    sxx = sum((xi - mx) ** 2 for xi in x)
    slope = sum((xi - mx) * (yi - my) for xi, yi in zip(x, y, strict=True)) / sxx
    residual = sum((yi - (my - slope * mx) - slope * xi) ** 2 for xi, yi in zip(x, y, strict=True))
    se = math.sqrt(residual / 1 / sxx)
    assert fit["b"] == pytest.approx(slope, rel=1e-12) and fit["se_b"] == pytest.approx(se, rel=1e-12)
    assert fit["p_no_trend"] == pytest.approx(2 * stats.t.sf(abs(slope) / se, 1), rel=1e-12)
    assert rep.trend_sentence("baseline", fit).startswith(
        "Δ (baseline) against log10(rank-4 parameters): slope -0.1319 ± 0.0526 (95 % interval -0.8006 to +0.5369; "
        "p = 0.24 for no trend) per decade; the fit changes sign within the ladder, at about 1,719,919"
    )


def test_the_report_marks_the_teacher_forced_ls_and_still_tests_its_cloze_outcomes(tmp_path):
    outcomes = {"rank4": [1, 0, 0, 1], "baseline": [1, 1, 0, 1], "baseline_lm": [1, 1, 1, 1]}
    rows = {
        f"d8/{family}": {
            "width": 8, "family": family, "params": 100, "learning_rate": 1e-3, "ls": ls, "context_gain": 0.5,
            "best_step": 2, "stopped_step": 4, "training_time_to_best_s": 10.0, "ms_per_step": 12.5,
            "cloze_accuracy": sum(outcomes[family]) / 4, "cloze_correct": {"mean_ce": outcomes[family]},
        }
        for family, ls in (("rank4", 5.0), ("baseline", 5.25), ("baseline_lm", 4.0))
    }  # fmt: skip
    by_family = {r["family"]: r for r in rows.values()}
    rungs = {8: lstats._rung_tests(by_family)}
    assert rungs[8] == {
        "delta_baseline": 0.25,
        "cloze_accuracy_mcnemar_p_baseline": 1.0,  # one discordant story
        "cloze_accuracy_mcnemar_p_baseline_lm": 0.5,  # two, both the LM's: 2 · 0.5²
    }
    table = rep.report_markdown({"split": "test", "rows": rows, "rungs": rungs, "trend": lstats.delta_trend(rows)})
    assert "| 8 | baseline_lm | 100 | 0.001 | 4.0000 (tf) | — | 2 / 4 |" in table
    assert "| 8 | baseline | 100 | 0.001 | 5.2500 | +0.2500 | 2 / 4 | 10 | 12.5 | 0.500 |" in table
    assert "| 8 | baseline_lm | 0.5 | — | — |" in table.split("McNemar")[1]  # its tests are reported
    assert rep.quiet_seconds_to_best(rows["d8/rank4"]) == 0.025  # 2 steps at 12.5 ms
    fig = rep.plot_ladder({"rows": rows}, str(tmp_path))
    assert os.path.getsize(tmp_path / "plots" / "ladder.png") > 0
    params, time, gain, lm_params, lm_time = fig.axes  # the LM's LS(T) on its own axis in the first two panels
    drawn = {ax: {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.lines}
             for ax in fig.axes}  # fmt: skip
    assert drawn[params] == {"rank4": ([100], [5.0]), "baseline": ([100], [5.25])}
    assert drawn[time] == {"rank4": ([0.025], [5.0]), "baseline": ([0.025], [5.25])}
    assert drawn[lm_params] == {"baseline_lm (teacher-forced, right axis)": ([100], [4.0])}
    assert drawn[lm_time] == {"baseline_lm (teacher-forced, right axis)": ([0.025], [4.0])}
    assert drawn[gain] == {name: ([100], [0.5]) for name in ("rank4", "baseline", "baseline_lm (teacher-forced)")}


def test_the_grid_families_configs_and_their_rates():
    """At V = 14,171 (the ladder's ROCStories vocabulary): the flat grid at the rung's fiber, the matched
    flat grid at the fiber nearest the rank-4 count (8 × 4 at D = 64, the ablation's), axial attention
    with the rank-4 model's parameters; flat_matched trains at the flat grid's rate, no sweep of its own."""
    from configs import rocstories

    base, vocab = rocstories.get_config(), 14_171
    expected = {  # width → family → (dx, dt, token_code, attention_grid, parameters)
        64: {"flat": (8, 8, "flat", "joint", 1_022_912), "flat_matched": (8, 4, "flat", "joint", 482_784),
             "axial": (8, 8, "outer", "axial", 456_072)},
        128: {"flat_matched": (7, 8, "flat", "joint", 882_504)},
        256: {"flat_matched": (9, 16, "flat", "joint", 2_624_112)},
    }  # fmt: skip
    for width, families in expected.items():
        for family, want in families.items():
            config = lad.family_config(base, family, width, vocab)
            model = config.model
            assert (model.dx, model.dt, model.token_code, model.attention_grid) == want[:4]
            assert run_param_count(config, vocab) == want[4]
    plan = lad.LadderPlan(families=("rank4", "flat", "flat_matched"), rates=(1e-3, 3e-3))
    assert list(lad.sweep_configs(base, plan, vocab, {"rank4": 3e-3})) == ["sweep/flat_lr0.001", "sweep/flat_lr0.003"]
    losses = {"sweep/flat_lr0.001": 1.4, "sweep/flat_lr0.003": 1.5}
    assert lad.pick_rates(losses, plan, {"rank4": 3e-3}) == {"rank4": 3e-3, "flat": 1e-3, "flat_matched": 1e-3}
    alone = lad.LadderPlan(families=("flat_matched",), rates=(1e-3,))  # without the flat grid: its own sweep
    assert list(lad.sweep_configs(base, alone, vocab, {})) == ["sweep/flat_matched_lr0.001"]
    tiny = lad.LadderPlan(families=("flat", "flat_matched"), widths=(8,))  # the matched fiber is the flat grid's
    with pytest.raises(ConfigError, match="at D = 8 the matched flat grid is the flat grid itself"):
        lad.rung_configs(tiny_config(), tiny, 147, {"flat": 1e-3, "flat_matched": 1e-3})


def test_the_grid_families_are_tested_against_both_references():
    """Δ and McNemar against the rank-4 model, the lead and McNemar against the baseline; the lead's
    trend by the family's own size."""
    outcomes = {"rank4": [1, 0, 0, 1], "baseline": [1, 1, 0, 1], "flat": [0, 0, 0, 0]}
    rows = {
        f"d{w}/{family}": {"width": w, "family": family, "params": 10 ** (w // 8 + 3) * (2 if family == "flat" else 1),
                           "ls": ls - (0.1 if w == 16 and family == "flat" else 0.0),
                           "cloze_correct": {"mean_ce": outcomes[family]}}
        for w in (8, 16)
        for family, ls in (("rank4", 5.0), ("baseline", 5.25), ("flat", 5.125))
    }  # fmt: skip
    tests = lstats._rung_tests({r["family"]: r for r in rows.values() if r["width"] == 8})
    assert tests == {
        "delta_baseline": 0.25, "cloze_accuracy_mcnemar_p_baseline": 1.0,
        "delta_flat": 0.125, "cloze_accuracy_mcnemar_p_flat": 0.5,  # two discordant stories, both rank-4's
        "lead_flat": 0.125, "cloze_accuracy_mcnemar_p_flat_vs_baseline": 0.25,  # three, all the baseline's
    }  # fmt: skip
    trend = lstats.lead_trend(rows)["flat"]  # leads 0.125 at 2·10^4 and 0.225 at 2·10^5 flat parameters
    assert trend["log10_params"] == pytest.approx([math.log10(2e4), math.log10(2e5)], abs=1e-15)
    assert trend["b"] == pytest.approx(0.1, abs=1e-12) and trend["crossing"] == "behind"
    assert rep.trend_sentence("flat", trend, lead=True) == (
        "The lead of flat over the baseline (the baseline's LS(T) − its own) against log10(flat parameters): "
        "slope +0.1000 (from 2 rungs: no uncertainty) per decade; the fit moves the lead away from zero as size grows."
    )
    # the matched grid against the flat grid at the same rung: its Δ and McNemar, in a table of its own
    rows["d8/flat_matched"] = {"width": 8, "family": "flat_matched", "params": 10**4, "ls": 5.0,
                               "cloze_correct": {"mean_ce": [1, 1, 1, 0]}}  # fmt: skip
    tests = lstats._rung_tests({r["family"]: r for r in rows.values() if r["width"] == 8})
    assert tests["delta_flat_matched_vs_flat"] == -0.125  # 5.0 − 5.125
    assert tests["cloze_accuracy_mcnemar_p_flat_matched_vs_flat"] == 0.25  # three discordant, all the matched grid's
    table = rep.report_markdown({"split": "test", "rows": {}, "rungs": {8: tests, 16: {}}, "trend": {}})
    header = "| D | family | Δ | mean CE | PMI | ending only |\n|---|---|---|---|---|---|\n"
    assert table.endswith(header + "| 8 | flat_matched | -0.1250 | 0.25 | — | — |")  # rung 16: neither grid


@pytest.fixture(scope="module")
def tiny_ladder(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("ladder"))
    base = tiny_config(eval_every=2, checkpoint_every=2)
    plan = lad.LadderPlan(families=("rank4", "baseline"), rates=(1e-3, 3e-2), sweep_steps=4, widths=(8, 16),
                          max_steps=6, patience=1)  # fmt: skip
    given = {"baseline": 3e-3}
    with pytest.raises(ConfigError, match="the rungs are known once the sweep has finished"):
        lad.ladder(base, workdir, plan, given=given, only="d8/rank4")
    lad.ladder(base, workdir, plan, given=given, only="sweep/rank4_lr0.001")  # one run, as a job would
    result = lad.ladder(base, workdir, plan, given=given, evaluate=lad.evaluator("test"))
    return workdir, base, plan, result


def test_ladder_picks_each_rate_matches_sizes_and_reports(tiny_ladder):
    workdir, base, plan, result = tiny_ladder
    assert sorted(os.listdir(os.path.join(workdir, "sweep"))) == ["rank4_lr0.001", "rank4_lr0.03"]
    swept = {
        rate: min(r["window_ce"] for r in read_metrics(os.path.join(workdir, f"sweep/rank4_lr{rate:g}"))["validation"])
        for rate in plan.rates
    }
    rows = result["rows"]
    assert set(rows) == {"d8/rank4", "d8/baseline", "d16/rank4", "d16/baseline"}
    assert rows["d8/rank4"]["learning_rate"] == min(swept, key=swept.get)
    assert rows["d16/baseline"]["learning_rate"] == 3e-3
    vocab = prepare_data(base, None).tokenizer.vocab_size
    for width in plan.widths:
        rank4, baseline = rows[f"d{width}/rank4"], rows[f"d{width}/baseline"]
        assert rank4["params"] == run_param_count(lad.rank4_config(base, width), vocab)
        config = lad.matched_config(lad.rank4_config(base, width), "baseline", vocab)
        here = config.model.dx * config.model.dt
        for other in (here - 4, here + 4):  # the neighbouring widths are no closer
            config.model.dx = other // 2
            assert abs(run_param_count(config, vocab) - rank4["params"]) >= abs(baseline["params"] - rank4["params"])
        report = json.load(open(os.path.join(workdir, f"d{width}/rank4/eval/test_step{rank4['best_step']}.json")))
        assert rank4["ls"] == report["last_slice_ce"]
        assert rank4["ms_per_step"] == steady_ms_per_step(os.path.join(workdir, f"d{width}/rank4"), base.batch_size)
        assert result["rungs"][width]["delta_baseline"] == baseline["ls"] - rank4["ls"]
    trend = result["trend"]["baseline"]
    (x0, x1), (d0, d1) = trend["log10_params"], trend["delta"]
    assert trend["b"] == pytest.approx((d1 - d0) / (x1 - x0), rel=1e-12)
    saved = json.load(open(os.path.join(workdir, "ladder.json")))
    assert saved["table"] == result["table"] == open(os.path.join(workdir, "ladder.md")).read().rstrip("\n")
    assert "| 16 | baseline |" in result["table"] and os.path.isfile(os.path.join(workdir, "plots", "ladder.png"))


def test_a_rate_other_than_the_one_a_run_was_trained_at_is_refused_and_changes_nothing(tiny_ladder):
    workdir, base, plan, _ = tiny_ladder
    config_file = os.path.join(workdir, "d8/baseline/config.json")
    before = open(config_file).read()
    message = r"^d8/baseline in .* was trained at learning rate 0\.003, but this ladder gives it 0\.01 "
    with pytest.raises(ConfigError, match=message):
        lad.ladder(base, workdir, plan, given={"baseline": 1e-2}, evaluate=lad.evaluator("test"))
    with pytest.raises(ConfigError, match=message):
        lad.status(base, workdir, plan, given={"baseline": 1e-2})
    assert open(config_file).read() == before


def test_status_reads_every_run_from_its_logs(tiny_ladder):
    workdir, base, plan, result = tiny_ladder
    table = lad.status(base, workdir, plan, given={"baseline": 3e-3})
    row = result["rows"]["d8/rank4"]
    best = min(read_metrics(os.path.join(workdir, "d8/rank4"))["validation"], key=lambda r: r["window_ce"])
    expected = (
        f"| d8/rank4 | {row['learning_rate']:g} | {row['stopped_step']} / {plan.max_steps} | "
        f"{best['window_ce']:.4f} ({best['step']}) | {best['last_slice_ce']:.4f} |"
    )
    assert expected in table and "| sweep/rank4_lr0.03 | 0.03 | 4 / 4 |" in table
    assert len(table.splitlines()) == 2 + 2 + 4  # header, the two sweep runs, the four rungs


def test_the_rate_pick_and_a_family_whose_every_sweep_run_diverged():
    plan = lad.LadderPlan(families=("rank4", "baseline"), rates=(1e-3, 3e-3))
    losses = {"sweep/rank4_lr0.001": 1.6, "sweep/rank4_lr0.003": 1.5}
    losses |= {"sweep/baseline_lr0.001": math.inf, "sweep/baseline_lr0.003": 5.4}
    assert lad.pick_rates(losses, plan, {}) == {"rank4": 3e-3, "baseline": 3e-3}
    assert lad.pick_rates(losses, plan, {"rank4": 1e-4}) == {"rank4": 1e-4, "baseline": 3e-3}
    losses["sweep/baseline_lr0.003"] = math.inf  # before: the pick fell to the first rate, one that diverged
    message = (
        "every sweep run of baseline diverged (learning rates 0.001, 0.003): give it a rate with "
        "--learning_rates=baseline=RATE, or sweep lower --rates in another --workdir"
    )
    with pytest.raises(ConfigError) as refused:
        lad.pick_rates(losses, plan, {})
    assert str(refused.value) == message
    assert lad.pick_rates(losses, plan, {"baseline": 1e-4})["baseline"] == 1e-4


def test_a_run_that_diverges_is_kept_out_by_name_and_the_ladder_goes_on(tmp_path, capsys):
    workdir, base = str(tmp_path), tiny_config(eval_every=2, checkpoint_every=2)
    plan = lad.LadderPlan(families=("rank4", "baseline"), rates=(1e-3, 1e38), sweep_steps=4, widths=(8,),
                          max_steps=4, patience=1)  # fmt: skip
    given = {"baseline": 1e38}  # its rung diverges; so does rank-4's sweep run at 1e38
    result = lad.ladder(base, workdir, plan, given=given, evaluate=lad.evaluator("test"))
    assert set(result["rows"]) == {"d8/rank4"} and result["rows"]["d8/rank4"]["learning_rate"] == 1e-3
    assert set(result["diverged"]) == {"d8/baseline"} and result["rungs"][8] == {} and result["trend"] == {}
    record = result["diverged"]["d8/baseline"]
    assert record["learning_rate"] == 1e38 and record["error"].startswith("training diverged at step ")
    assert f"d8/baseline (lr 1e+38) has no figures: {record['error']}" in result["table"]
    for name in ("sweep/rank4_lr1e+38", "d8/baseline"):
        assert os.path.isfile(os.path.join(workdir, name, lad.DIVERGED_FILE))
    capsys.readouterr()
    again = lad.ladder(base, workdir, plan, given=given, evaluate=lad.evaluator("test"))  # nothing trains again
    said = capsys.readouterr()
    assert said.err.count("diverged before (training diverged at step ") == 2
    assert said.out.count(f"{workdir}/d8/rank4 is at step 4, num_steps=4: nothing to train") == 1  # restored once
    assert again["table"] == result["table"]
    table = lad.status(base, workdir, plan, given=given)
    assert "| sweep/rank4_lr1e+38 | 1e+38 | " in table and "| d8/baseline | 1e+38 | " in table
    assert table.count(" (diverged) / 4 |") == 2


def test_the_training_data_is_refused_as_cloze_data_by_content_and_an_overlap_is_marked(tmp_path):
    """The runs' own training file is refused as --cloze_data through a link or as a copy (content, not
    path); a file that shares stories with the training split is marked in the tables."""
    from rank4jax.experiments.compare import cloze_markdown

    data, link, copy, other = (tmp_path / name for name in ("own.csv", "link.csv", "copy.csv", "other.csv"))
    data.write_text("storyid,sentence1\nx,a\n")
    copy.write_text(data.read_text())
    other.write_text("storyid,sentence1\ny,b\n")
    link.symlink_to(data)
    own = tiny_config(**{"data.source": "file", "data.path": str(data)})
    for path in (data, link, copy):
        with pytest.raises(ConfigError, match="is the models' own training data"):
            lad.evaluator("test", str(path), 8, config=own)
    lad.evaluator("test", str(other), 8, config=own)  # another file: accepted
    res = {"cloze_data": "f.csv", "rank4_cloze_stories": 40, "rank4_cloze_contexts": 8, "rank4_trained_on_stories": 25}
    res |= {"rank4_cloze_accuracy": 0.6, "baseline_cloze_accuracy": 0.5, "cloze_accuracy_mcnemar_p": 0.2}
    res |= {"rank4_cloze_accuracy_interval": (0.5, 0.7), "baseline_cloze_accuracy_interval": (0.4, 0.6)}
    assert "**Not held out**: 25 of these stories are stories the runs trained on" in "\n".join(cloze_markdown(res))
    rows = {"d8/rank4": {"width": 8, "family": "rank4", "params": 1, "learning_rate": 1e-3, "ls": 5.0,
                         "context_gain": None, "best_step": 2, "stopped_step": 4, "training_time_to_best_s": 1.0,
                         "ms_per_step": 1.0, "cloze_trained_on": 25}}  # fmt: skip
    table = rep.report_markdown({"split": "test", "rows": rows, "rungs": {8: {}}, "trend": {}})
    assert "**Not held out**: up to 25 of the Story Cloze stories" in table
