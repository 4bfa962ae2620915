"""The ladder's statistics, from its runs' figures (``summarise``): per rung, Δ of every family against
the rank-4 model and McNemar's exact test of their Story Cloze outcomes (and, for the grid ablations,
against the baseline; the matched grid against the flat grid); over the rungs, the trend of Δ with
size (a least-squares line against log10 of the parameters, with its interval and where it is zero)."""

from __future__ import annotations

import math

import numpy as np

from rank4jax.evaluation.significance import mcnemar_exact
from rank4jax.experiments.compare import CLOZE_RULES
from rank4jax.experiments.families import GRID_ABLATIONS, TEACHER_FORCED


def summarise(runs: dict, split: str) -> dict:
    """Per run (``rows``: name → figures) and per rung (``rungs``: width → Δ and the McNemar tests of
    every family against the rank-4 model), and the trend of Δ = baseline − rank-4 with size."""
    rows, rungs = {}, {}
    for name, run in runs.items():
        width, family = _rung_of(name)
        cloze = run.extra.get("cloze", run.report)
        rows[name] = {
            "width": width,
            "family": family,
            "params": run.summary["parameters"],
            "learning_rate": run.config.optim.learning_rate,
            "ls": run.report["last_slice_ce"],
            "context_gain": run.report.get("context_gain"),
            "best_step": run.summary["best_step"],
            "stopped_step": run.summary["step"],
            "early_stopped": run.summary["early_stopped"],
            "training_time_s": run.summary["training_time_s"],
            "training_time_to_best_s": run.summary["training_time_to_best_s"],
            "ms_per_step": run.ms_per_step,  # the median interval: what a few contended intervals do not move
            **{key: cloze.get(key) for key in ("cloze_stories", *CLOZE_RULES)},
            "cloze_correct": cloze.get("cloze_correct"),
            "cloze_trained_on": cloze.get("trained_on_stories"),  # stories the run trained on (not held out)
        }
    for width in sorted({r["width"] for r in rows.values()}):
        rungs[width] = _rung_tests({r["family"]: r for r in rows.values() if r["width"] == width})
    return {"split": split, "rows": rows, "rungs": rungs, "trend": delta_trend(rows), "lead_trend": lead_trend(rows)}


def _rung_of(name: str) -> tuple[int, str]:
    rung, family = name.split("/")
    return int(rung.removeprefix("d")), family


def _rung_tests(by_family: dict) -> dict:
    """At one rung: Δ of every other family's LS(T) against the rank-4 model's (``delta_<family>``) and
    McNemar's exact p of its Story Cloze outcomes against the rank-4 model's, per rule
    (``<rule>_mcnemar_p_<family>``); and for the grid ablations (``GRID_ABLATIONS``), the lead over the
    baseline (``lead_<family>`` = the baseline's LS(T) − its own) and McNemar against the baseline
    (``<rule>_mcnemar_p_<family>_vs_baseline``); and the matched grid against the flat grid at the rung's
    width (``delta_flat_matched_vs_flat`` = its LS(T) − the flat grid's, ``<rule>_mcnemar_p_flat_matched_vs_flat``)."""
    out = {}
    rank4, baseline, flat = by_family.get("rank4"), by_family.get("baseline"), by_family.get("flat")
    for family, row in by_family.items():
        if rank4 is not None and family != "rank4":
            if (gap := delta(row, rank4)) is not None:
                out[f"delta_{family}"] = gap
            out |= _mcnemar(rank4, row, family)
        if baseline is not None and family in GRID_ABLATIONS:
            if (gap := delta(row, baseline)) is not None:
                out[f"lead_{family}"] = -gap
            out |= _mcnemar(baseline, row, f"{family}_vs_baseline")
    if flat is not None and (matched := by_family.get("flat_matched")) is not None:
        out["delta_flat_matched_vs_flat"] = matched["ls"] - flat["ls"]
        out |= _mcnemar(flat, matched, "flat_matched_vs_flat")
    return out


def _mcnemar(reference: dict, row: dict, name: str) -> dict:
    out = {}
    for key, (rule, _) in CLOZE_RULES.items():
        a, b = (reference.get("cloze_correct") or {}).get(rule), (row.get("cloze_correct") or {}).get(rule)
        if a is not None and b is not None:
            out[f"{key}_mcnemar_p_{name}"] = mcnemar_exact(a, b)["p_value"]
    return out


def delta(row: dict, reference: dict) -> float | None:
    """Δ = a run's LS(T) − the reference's (the rank-4 model's) at the same rung; None for a teacher-forced
    LS(T) (each S(T) token after the gold ones before it), which is no comparison with a free-running one."""
    return None if row["family"] in TEACHER_FORCED else row["ls"] - reference["ls"]


def linear_fit(x, y) -> dict:
    """Least squares y ≈ a + b·x (``scipy.stats.linregress``): a, b, their standard errors, the 95 %
    interval of b and the two-sided p of b = 0 (Student's t with n − 2 degrees of freedom); the last
    four None with fewer than three points or a perfect fit (no spread to measure). A ValueError for
    a NaN, or for points that share one x (no slope to fit)."""
    from scipy import stats

    x, y = np.asarray(x, float), np.asarray(y, float)
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ValueError(f"linear_fit: the points must be finite numbers, got x = {x.tolist()}, y = {y.tolist()}")
    if len(x) < 2 or np.all(x == x[0]):
        raise ValueError(f"linear_fit: a slope needs two points or more at different x, got x = {x.tolist()}")
    fit = stats.linregress(x, y)
    a, b = float(fit.intercept), float(fit.slope)
    residuals = y - (a + b * x)
    if len(x) < 3 or np.max(np.abs(residuals)) <= 1e-12 * max(1.0, float(np.max(np.abs(y)))):  # on a line
        return {"a": a, "b": b, "se_a": None, "se_b": None, "b_interval": None, "p_no_trend": None}
    half = float(stats.t.ppf(0.975, len(x) - 2)) * float(fit.stderr)
    return {"a": a, "b": b, "se_a": float(fit.intercept_stderr), "se_b": float(fit.stderr),
            "b_interval": [b - half, b + half], "p_no_trend": float(fit.pvalue)}  # fmt: skip


def delta_trend(rows: dict) -> dict:
    """For each free-running family against the rank-4 model: Δ = its LS(T) − rank-4's at each rung, fitted against
    log10 of the rank-4 parameter count (``linear_fit``), and where the fit is zero: ``crossing_params`` (None
    for a flat fit) and ``crossing``, which says where that is — ``"ahead"`` (beyond the largest rung: the
    size at which Δ would change sign if the trend held), ``"inside"`` (the fit changes sign within the
    ladder) or ``"behind"`` (below the smallest rung: the fit moves Δ away from zero as size grows)."""
    rank4 = {r["width"]: r for r in rows.values() if r["family"] == "rank4"}
    trends = {}
    for family in sorted({r["family"] for r in rows.values()} - {"rank4"}):
        points = sorted(
            (math.log10(rank4[r["width"]]["params"]), delta(r, rank4[r["width"]]))
            for r in rows.values()
            if r["family"] == family and r["width"] in rank4
        )
        if len(points) < 2 or any(gap is None for _, gap in points):
            continue
        trends[family] = _trend(points)
    return trends


def lead_trend(rows: dict) -> dict:
    """For each grid ablation (``GRID_ABLATIONS``): its lead over the baseline (the baseline's LS(T) − its
    own at each rung, > 0: ahead) fitted against log10 of its own parameter count, with the zero as
    :func:`delta_trend` finds it (``delta``: the leads)."""
    baseline = {r["width"]: r for r in rows.values() if r["family"] == "baseline"}
    trends = {}
    for family in sorted({r["family"] for r in rows.values()} & set(GRID_ABLATIONS)):
        points = sorted(
            (math.log10(r["params"]), baseline[r["width"]]["ls"] - r["ls"])
            for r in rows.values()
            if r["family"] == family and r["width"] in baseline
        )
        if len(points) >= 2:
            trends[family] = _trend(points)
    return trends


def _trend(points: list) -> dict:
    """The linear fit of (x, y) points sorted by x and where it is zero: ``crossing_params`` = 10**x there
    (None for a flat fit) and ``crossing`` "ahead" / "inside" / "behind" the points (:func:`delta_trend`)."""
    x, y = zip(*points, strict=True)
    fit = linear_fit(x, y)
    zero = -fit["a"] / fit["b"] if fit["b"] != 0 else None
    where = None if zero is None else "ahead" if zero > x[-1] else "behind" if zero < x[0] else "inside"
    crossing = None if zero is None else 10**zero
    return fit | {"log10_params": list(x), "delta": list(y), "crossing_params": crossing, "crossing": where}
