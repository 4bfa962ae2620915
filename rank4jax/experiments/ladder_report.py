"""The ladder's report: its markdown table (one row per run), the McNemar tables, the trend
sentences, and ``plots/ladder.png``, all from ``rank4jax.experiments.ladder_stats.summarise``'s result."""

from __future__ import annotations

import os

from rank4jax import files
from rank4jax.evaluation.significance import wilson_interval
from rank4jax.experiments.compare import CLOZE_RULES
from rank4jax.experiments.families import FAMILIES, TEACHER_FORCED


def trend_sentence(family: str, fit: dict, lead: bool = False) -> str:
    """One line of the report: the slope of Δ per decade of parameters, its uncertainty, and where Δ is
    zero; ``lead``: of a :func:`lead_trend` (the family's lead over the baseline, by its own size)."""
    if fit["se_b"] is None:
        spread = f" (from {len(fit['delta'])} rungs: no uncertainty)"
    else:
        lo, hi = fit["b_interval"]
        spread = (
            f" ± {fit['se_b']:.4f} (95 % interval {lo:+.4f} to {hi:+.4f}; p = {fit['p_no_trend']:.2g} for no trend)"
        )
    size, what = (f"{family} parameters", "the lead") if lead else ("rank-4 parameters", "Δ")
    where = {
        None: "the fit is flat",
        "ahead": "it would reach 0 at about {:,.0f} " + size + " if the trend held",
        "inside": "the fit changes sign within the ladder, at about {:,.0f} "
        + size
        + ", and moves "
        + what
        + " away from zero beyond it",
        "behind": f"the fit moves {what} away from zero as size grows",
    }[fit["crossing"]].format(fit["crossing_params"])  # a flat fit has no zero to format
    if lead:
        return (
            f"The lead of {family} over the baseline (the baseline's LS(T) − its own) against log10({size}): "
            f"slope {fit['b']:+.4f}{spread} per decade; {where}."
        )
    return f"Δ ({family}) against log10({size}): slope {fit['b']:+.4f}{spread} per decade; {where}."


def _accuracy(row: dict, key: str) -> str:
    outcomes = (row.get("cloze_correct") or {}).get(CLOZE_RULES[key][0])
    if row.get(key) is None or outcomes is None:
        return "—"
    lo, hi = wilson_interval(sum(outcomes), len(outcomes))
    return f"{row[key]:.4f} ({lo:.3f}–{hi:.3f})"


def seconds_text(value) -> str:
    return "—" if value is None else f"{value:,.0f}"


def report_markdown(result: dict) -> str:
    """The ladder's table (one row per run), the McNemar tests per rung, and the trend of Δ."""
    lines = [
        f"LS(T) on the {result['split']} split; Δ = the family's LS(T) − the rank-4 model's at the same rung "
        "(> 0: the rank-4 model is lower); (tf): teacher-forced, each S(T) token after the gold ones before it, "
        "so no Δ. Story Cloze accuracies with 95 % Wilson intervals"
        + (f" on every story of {result['cloze_data']}" if result.get("cloze_data") else "")
        + "; training time: the logged training intervals to the selected checkpoint; ms/step: the median of"
        " those intervals, which a few slowed by other work on the machine do not move.",
        "",
        "| D | family | params | lr | LS(T) | Δ | best step / stopped | time to best (s) | ms/step | context gain "
        "| Cloze mean CE | Cloze PMI | Cloze ending only |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in sorted(result["rows"].values(), key=lambda r: (r["width"], list(FAMILIES).index(r["family"]))):
        delta = result["rungs"][row["width"]].get(f"delta_{row['family']}")
        gain = row["context_gain"]
        lines.append(
            f"| {row['width']} | {row['family']} | {row['params']:,} | {row['learning_rate']:g} | {row['ls']:.4f}"
            f"{' (tf)' if row['family'] in TEACHER_FORCED else ''} | "
            f"{'—' if delta is None else f'{delta:+.4f}'} | {row['best_step']} / {row['stopped_step']} | "
            f"{seconds_text(row['training_time_to_best_s'])} | {row['ms_per_step']:.1f} | "
            f"{'—' if gain is None else f'{gain:.3f}'} | "
            + " | ".join(_accuracy(row, key) for key in CLOZE_RULES)
            + " |"
        )
    tests = _test_rows(result, "")
    if tests:
        lines += ["", "McNemar's exact p against the rank-4 model at the same rung:", ""]
        lines += ["| D | family | mean CE | PMI | ending only |", "|---|---|---|---|---|", *tests]
    trained_on = max((r.get("cloze_trained_on") or 0 for r in result["rows"].values()), default=0)
    if trained_on:
        lines += ["", f"**Not held out**: up to {trained_on:,} of the Story Cloze stories are stories the runs "
                  "trained on, so those accuracies overstate what a held-out set would give."]  # fmt: skip
    for name, record in result.get("diverged", {}).items():
        lines += ["", f"{name} (lr {record['learning_rate']:g}) has no figures: {record['error']}"]
    against_baseline = _test_rows(result, "_vs_baseline", gap="lead_{family}")
    if against_baseline:
        lines += ["", "Against the baseline at the same rung (lead: the baseline's LS(T) − the family's; McNemar's p):"]
        lines += ["", "| D | family | lead | mean CE | PMI | ending only |", "|---|---|---|---|---|---|"]
        lines += against_baseline
    matched = _test_rows(result, "_vs_flat", gap="delta_{family}_vs_flat")
    if matched:
        lines += [
            "",
            "The matched grid against the flat grid at the same rung (Δ: its LS(T) − the flat grid's; McNemar's p):",
        ]
        lines += ["", "| D | family | Δ | mean CE | PMI | ending only |", "|---|---|---|---|---|---|", *matched]
    for family, fit in result["trend"].items():
        lines += ["", trend_sentence(family, fit)]
    for family, fit in result.get("lead_trend", {}).items():
        lines += ["", trend_sentence(family, fit, lead=True)]
    return "\n".join(lines)


def _test_rows(result: dict, suffix: str, gap: str | None = None) -> list[str]:
    """The McNemar tables' rows, one per rung and family that has them: against the rank-4 model
    (``suffix`` ""), the baseline ("_vs_baseline", ``gap`` "lead_{family}": the family's lead over it)
    or the flat grid ("_vs_flat", ``gap`` "delta_{family}_vs_flat")."""
    rows = []
    for width, tests in sorted(result["rungs"].items()):
        for family in FAMILIES:
            p = [tests.get(f"{key}_mcnemar_p_{family}{suffix}") for key in CLOZE_RULES]
            lead = tests.get(gap.format(family=family)) if gap else None
            if all(v is None for v in p) and lead is None:
                continue
            cells = ([f"{lead:+.4f}"] if gap else []) + ["—" if v is None else f"{v:.3g}" for v in p]
            rows.append(f"| {width} | {family} | " + " | ".join(cells) + " |")
    return rows


def quiet_seconds_to_best(row: dict) -> float:
    """Training time to the selected step at the run's median step time (``ms_per_step``): what the
    run takes on a machine it has to itself, where the logged time also counts other work beside it."""
    return row["best_step"] * row["ms_per_step"] / 1000


def plot_ladder(result: dict, workdir: str):
    """``workdir/plots/ladder.png``: LS(T) against parameters (log scale) and against training time
    (``quiet_seconds_to_best``), one line per family; context gain against parameters. A teacher-forced
    LS(T) is no comparison with a free-running one and sits about 1.5 nats lower, so it is drawn dashed
    on its own axis at the right. Returns the (closed) figure, whose axes hold what was drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(17, 4.5))
    forced = (
        [axes[0].twinx(), axes[1].twinx()]
        if any(r["family"] in TEACHER_FORCED for r in result["rows"].values())
        else None
    )
    for n, family in enumerate(FAMILIES):
        rows = sorted((r for r in result["rows"].values() if r["family"] == family), key=lambda r: r["params"])
        if not rows:
            continue
        tf = family in TEACHER_FORCED
        style = {
            "color": f"C{n}",
            "marker": "o",
            "linestyle": "--" if tf else "-",
            "label": family + (" (teacher-forced, right axis)" if tf else ""),
        }
        ls_axes = forced if tf else axes[:2]
        seconds, ls = [quiet_seconds_to_best(r) for r in rows], [r["ls"] for r in rows]
        ls_axes[0].plot([r["params"] for r in rows], ls, **style)
        ls_axes[1].plot(seconds, ls, **style)
        for r, point in zip(rows, zip(seconds, ls, strict=True), strict=True):  # time does not order the rungs
            ls_axes[1].annotate(f"D {r['width']}", point, xytext=(4, 4), textcoords="offset points", fontsize=7,
                                color=style["color"])  # fmt: skip
        gains = [(r["params"], r["context_gain"]) for r in rows if r["context_gain"] is not None]
        axes[2].plot(*zip(*gains, strict=True), **style | {"label": family + (" (teacher-forced)" if tf else "")})
    titles = (
        "LS(T) against parameters",
        "LS(T) against training time to the selected step",
        "context gain against parameters",
    )
    xlabels = ("parameters", "seconds (selected step × median ms/step)", "parameters")
    ylabels = ("LS(T), free-running (nats)", "LS(T), free-running (nats)", "nats per S(T) token")
    for n, (ax, title, xl, yl) in enumerate(zip(axes, titles, xlabels, ylabels, strict=True)):
        ax.set(xscale="log", title=title, xlabel=xl, ylabel=yl)
        ax.ticklabel_format(axis="y", useOffset=False)  # a 0.0001-nat change is not drawn as a fall
        ax.grid(alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        if forced and n < 2:
            forced[n].set_ylabel("LS(T), teacher-forced (nats)")
            more = forced[n].get_legend_handles_labels()
            handles, labels = handles + more[0], labels + more[1]
        ax.legend(handles, labels, fontsize="small")
    fig.tight_layout()
    try:
        files.save_figure(fig, workdir, os.path.join("plots", "ladder.png"), dpi=100)
    finally:
        plt.close(fig)
    return fig
