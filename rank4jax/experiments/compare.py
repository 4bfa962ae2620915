"""The paper's fair comparison (SPEC §7, §9): the rank-4 model against the 1-D causal baseline on
the same windows, at matched parameter counts, reported like the paper's Table 5 and Figures 2–4.

Both runs live under one workdir (``rank4/`` and ``baseline/``), resume like any run, and are then
evaluated from their selected checkpoints (rank-4: lowest validation window loss; baseline: lowest
free-running S(T)+EOS loss). LS(T) of both is the mean CE over the same content tokens of S(T).
"""

from __future__ import annotations

import hashlib
import os

import ml_collections

from rank4jax import files
from rank4jax.engine.run_config import to_json_dict
from rank4jax.errors import ConfigError
from rank4jax.evaluation.evaluators import CLOZE_CONTEXTS
from rank4jax.evaluation.report import check_count
from rank4jax.evaluation.significance import mcnemar_exact, wilson_interval
from rank4jax.experiments.runner import run_all, write_outputs
from rank4jax.models.family import FAMILIES

SAME_SECTIONS = ("data", "tokenizer", "seed")
SAME_MODEL_FIELDS = ("n_tokens", "n_slices")


def _check_same_windows(rank4: ml_collections.ConfigDict, base: ml_collections.ConfigDict) -> None:
    a, b = to_json_dict(rank4), to_json_dict(base)
    for section in SAME_SECTIONS:
        if a[section] != b[section]:
            raise ConfigError(f"the two configs must share '{section}' so both models see the same windows")
    for field in SAME_MODEL_FIELDS:
        if a["model"][field] != b["model"][field]:
            raise ConfigError(
                f"the two configs must share model.{field} (rank-4 {a['model'][field]}, baseline {b['model'][field]})"
            )
    if a["model_family"] != "rank4" or b["model_family"] != "baseline":
        raise ConfigError("compare needs a model_family='rank4' config and a model_family='baseline' config")


def _same_content(a: str, b: str) -> bool:
    """Whether two paths hold the same bytes (the same file through a link, or a copy)."""
    if not (os.path.isfile(a) and os.path.isfile(b)):
        return False
    if os.path.samefile(a, b):
        return True
    if os.path.getsize(a) != os.path.getsize(b):
        return False
    digests = []
    for path in (a, b):
        with open(path, "rb") as f:
            digests.append(hashlib.file_digest(f, "sha256").digest())
    return digests[0] == digests[1]


def check_cloze_data(cloze_data: str | None, config) -> None:
    """A ConfigError when ``cloze_data`` is missing or holds the runs' own training data (``config``'s),
    by content: a link to it or a copy of it too."""
    if not cloze_data:
        return
    if not os.path.isfile(cloze_data):
        raise ConfigError(f"--cloze_data: file not found: {cloze_data}")
    own = [p.strip() for p in config.data.path.split(",") if p.strip()]
    if config.data.source == "file" and any(_same_content(cloze_data, path) for path in own):
        raise ConfigError(
            f"--cloze_data {cloze_data} is the models' own training data; its test split's Story Cloze "
            "accuracy is already in the report (leave --cloze_data empty)"
        )


def compare(
    rank4_config,
    baseline_config,
    workdir: str,
    split: str = "test",
    cloze_data: str | None = None,
    cloze_contexts: int = CLOZE_CONTEXTS,
    wide_config=None,
) -> dict:
    """Train (or resume) the runs, evaluate each selected checkpoint on ``split`` and, with
    ``cloze_data``, on every story of that Story Cloze file (three scoring rules, K = ``cloze_contexts``
    lent contexts); write the table. ``wide_config``: a third run, the baseline at the paper's width
    rule (D = dx·dt of the rank-4 fiber), reported beside the parameter-matched one."""
    configs = {"rank4": rank4_config, "baseline": baseline_config}
    if wide_config is not None:
        configs["baseline_wide"] = wide_config
    for name, config in configs.items():
        if name != "rank4":
            _check_same_windows(rank4_config, config)
    check_cloze_data(cloze_data, rank4_config)
    check_count("--cloze_contexts", cloze_contexts)  # before any training, not after the first stage
    options = {"num_examples": 0, "rollout_steps": 0, "cloze_contexts": cloze_contexts}
    extra = {"cloze": {"split": "all", "data_path": cloze_data} | options}
    runs = run_all(
        configs, workdir, split=split, num_examples=3, cloze_contexts=cloze_contexts,
        extra_evals=extra if cloze_data else None,
    )  # fmt: skip
    result = summarise(runs, split)
    result["cloze_data"] = cloze_data or (runs["rank4"].report["data"] + f" ({split} split)")
    result["table"] = table_markdown(result, rank4_config)
    write_outputs(workdir, "compare", result, result["table"])
    families = {name: run.config.model_family for name, run in runs.items()}
    curves = {name: run.curves for name, run in runs.items()}
    plot_comparison(curves, families, workdir)
    return result


def summarise(runs: dict, split: str) -> dict:
    """Each run's LS(T), parameters, training time (``wall_s``: every logged interval; ``time_to_best_s``:
    to the selected checkpoint), selection, context measures and Story Cloze figures (``<name>_<key>``),
    and each baseline against the rank-4 model: Δ, the training-time ratio and the
    McNemar tests (the width-matched baseline's with ``_wide`` appended)."""
    tokens = runs["rank4"].report["last_slice_tokens"]
    result = {"split": split, "ls_tokens": tokens}
    for name, run in runs.items():
        assert run.report["last_slice_tokens"] == tokens, "LS(T) must cover the same tokens"
        result |= {
            f"{name}_ls": run.report["last_slice_ce"],
            f"{name}_params": run.summary["parameters"],
            f"{name}_wall_s": run.summary["training_time_s"],
            f"{name}_time_to_best_s": run.summary["training_time_to_best_s"],
            f"{name}_best_val_ls": run.best_val_ls,
            f"{name}_best_step": run.summary["best_step"],
        }
        for key in ("last_slice_ce_other_context", "context_gain"):  # how much each model uses the story
            result[f"{name}_{key}"] = run.report.get(key)
        report = run.extra.get("cloze", run.report)  # the external file's endings, else the split's own
        for key in ("cloze_stories", "cloze_contexts", "trained_on_stories", *CLOZE_RULES):
            result[f"{name}_{key}"] = report.get(key)
    cloze = {name: run.extra.get("cloze", run.report) for name, run in runs.items()}
    for name, suffix in (("baseline", ""), ("baseline_wide", "_wide")):
        if name in runs:
            result[f"delta{suffix}"] = result[f"{name}_ls"] - result["rank4_ls"]  # > 0: the rank-4 model is lower
            result[f"wall_ratio{suffix}"] = result[f"{name}_wall_s"] / result["rank4_wall_s"]
            result |= cloze_tests(cloze["rank4"], cloze[name], name, suffix)
    return result


CLOZE_RULES = {  # report key → (the per-story outcomes' key, the rule in words)
    "cloze_accuracy": ("mean_ce", "mean CE of the ending as S(T)"),
    "cloze_accuracy_normalised": ("pmi", "PMI: log p(e \\| story) − log p(e), p(e) over {k} other stories' contexts"),
    "cloze_accuracy_ending_only": ("ending_only", "ending only: the higher p(e) = mean over {k} lent contexts"),
}


def cloze_tests(rank4: dict, other: dict, other_name: str = "baseline", suffix: str = "") -> dict:
    """McNemar's exact p-value between the rank-4 model and another on the same stories
    (``<rule>_mcnemar_p<suffix>``), and each model's 95 % Wilson interval, for each Story Cloze rule
    both reports carry."""
    out = {}
    for key, (rule, _) in CLOZE_RULES.items():
        a, b = rank4.get("cloze_correct", {}).get(rule), other.get("cloze_correct", {}).get(rule)
        if a is None or b is None:
            continue
        out[f"{key}_mcnemar_p{suffix}"] = mcnemar_exact(a, b)["p_value"]
        out[f"rank4_{key}_interval"] = wilson_interval(sum(a), len(a))
        out[f"{other_name}_{key}_interval"] = wilson_interval(sum(b), len(b))
    return out


def _lower(a: float, b: float, names=("rank-4", "baseline")) -> str:
    return "tie" if a == b else names[0] if a < b else names[1]


def cloze_markdown(res: dict) -> list[str]:
    """The Story Cloze lines of the table: the three scoring rules for both models, and who is higher."""
    if res.get("rank4_cloze_accuracy") is None:
        return []
    trained_on = res.get("rank4_trained_on_stories") or 0
    lines = [
        "",
        f"Story Cloze accuracy on {res['rank4_cloze_stories']} stories of {res['cloze_data']} "
        "(chance 0.5; higher is better):",
        *(
            [
                f"**Not held out**: {trained_on:,} of these stories are stories the runs trained on, so these "
                "accuracies overstate what a held-out set would give."
            ]
            if trained_on
            else []
        ),  # fmt: skip
        "",
        "| scoring rule | rank-4 (95 % interval) | baseline (95 % interval) | higher | McNemar p |",
        "|---|---|---|---|---|",
    ]
    for key, (_, label) in CLOZE_RULES.items():
        a, b = res.get(f"rank4_{key}"), res.get(f"baseline_{key}")
        if a is None or b is None:
            continue
        (a_lo, a_hi), (b_lo, b_hi) = res[f"rank4_{key}_interval"], res[f"baseline_{key}_interval"]
        lines.append(
            f"| {label.format(k=res['rank4_cloze_contexts'])} | {a:.4f} ({a_lo:.3f}–{a_hi:.3f}) | "
            f"{b:.4f} ({b_lo:.3f}–{b_hi:.3f}) | {_lower(-a, -b)} | {res[f'{key}_mcnemar_p']:.3g} |"
        )
    return lines


def context_markdown(res: dict) -> list[str]:
    """How much each model uses the story: LS(T) with its own context and with another story's."""
    if res.get("rank4_last_slice_ce_other_context") is None:
        return []
    rows = [
        ("LS(T), own context", "rank4_ls", "baseline_ls"),
        ("LS(T), another story's context", "rank4_last_slice_ce_other_context", "baseline_last_slice_ce_other_context"),
        ("context gain (nats)", "rank4_context_gain", "baseline_context_gain"),
    ]
    lines = ["", "How much each model uses the story (same windows, contexts swapped by a fixed derangement):", ""]
    lines += ["| | rank-4 | baseline |", "|---|---|---|"]
    return lines + [f"| {label} | {res[a]:.4f} | {res[b]:.4f} |" for label, a, b in rows]


def table_markdown(res: dict, rank4_config) -> str:
    m = rank4_config.model
    setting = f"H={m.n_heads}, L={m.n_layers}, dx={m.dx}, dt={m.dt}"
    return "\n".join(
        [
            "| setting | rank-4 LS(T) | baseline LS(T) | Δ | params rank-4 / baseline "
            "| training time rank-4 / baseline | ratio |",
            "|---|---|---|---|---|---|---|",
            f"| {setting} | {res['rank4_ls']:.3f} | {res['baseline_ls']:.3f} | {res['delta']:+.3f} | "
            f"{res['rank4_params'] / 1e6:.3f}M / {res['baseline_params'] / 1e6:.3f}M | "
            f"{res['rank4_wall_s']:.0f} s / {res['baseline_wall_s']:.0f} s | {res['wall_ratio']:.2f}× |",
            "",
            f"LS(T) on the {res['split']} split over {res['ls_tokens']} content tokens of S(T), from each model's "
            f"selected checkpoint (rank-4 step {res['rank4_best_step']}, baseline step {res['baseline_best_step']}); "
            f"lowest logged validation LS(T): rank-4 {res['rank4_best_val_ls']:.3f}, "
            f"baseline {res['baseline_best_val_ls']:.3f}. Training time: the logged training intervals' wall "
            f"time over every start of the run, to the selected checkpoint {res['rank4_time_to_best_s']:.0f} s "
            f"(rank-4) and {res['baseline_time_to_best_s']:.0f} s (baseline). Δ > 0 means the rank-4 model is lower "
            f"(lower LS(T) here: {_lower(res['rank4_ls'], res['baseline_ls'])}). The paper (Table 5, ≈98k "
            "ROCStories, V = 36,711): 5.562 vs 5.873 (H=2, L=2), 5.554 vs 5.701 (H=4, L=2), 5.531 vs 5.667 "
            "(H=4, L=3); wall time 2.4 h vs 45.2 h.",
            *context_markdown(res),
            *cloze_markdown(res),
            *wide_markdown(res),
        ]
    )


def wide_markdown(res: dict) -> list[str]:
    """The width-matched baseline (the paper's rule: D = dx·dt) beside the rank-4 model."""
    if "baseline_wide_ls" not in res:
        return []
    w = "baseline_wide"
    lines = ["", "The paper's width rule: the baseline at D = dx·dt, the rank-4 fiber's width:", ""]
    lines += [
        "| | LS(T) | Δ | params | training time (to best) | ratio | best step | context gain |",
        "|---|---|---|---|---|---|---|---|",
    ]
    gain = res.get(f"{w}_context_gain")
    lines.append(
        f"| width-matched baseline | {res[f'{w}_ls']:.3f} | {res['delta_wide']:+.3f} | "
        f"{res[f'{w}_params'] / 1e6:.3f}M | {res[f'{w}_wall_s']:.0f} s ({res[f'{w}_time_to_best_s']:.0f} s) | "
        f"{res['wall_ratio_wide']:.2f}× | "
        f"{res[f'{w}_best_step']} | {'—' if gain is None else f'{gain:.4f}'} |"
    )
    for key, (_, label) in CLOZE_RULES.items():
        if res.get(f"{key}_mcnemar_p_wide") is not None:
            lo, hi = res[f"{w}_{key}_interval"]
            lines.append(
                f"| Story Cloze, {label.format(k=res[f'{w}_cloze_contexts'])} | {res[f'{w}_{key}']:.4f} "
                f"({lo:.3f}–{hi:.3f}) | McNemar p vs rank-4 {res[f'{key}_mcnemar_p_wide']:.3g} | | | | | |"
            )
    return lines


def plot_comparison(curves: dict, families: dict, workdir: str) -> None:
    """Training and validation curves of every run (the paper's Figures 2–4) into
    ``workdir/plots/compare_curves.png``; ``families``: run name → model family, whose selection loss
    labels the curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # one loss per axis: each run's own selection loss (training and validation: the same quantity),
    # then the validation LS(T) of every run (the one loss the families share)
    fig, axes = plt.subplots(1, len(curves) + 1, figsize=(5 * (len(curves) + 1), 4))
    for ax, (name, metrics) in zip(axes, curves.items(), strict=False):
        for split, key, label in (("train", "loss", "training"), ("validation", "window_ce", "validation")):
            pts = [(r["step"], r[key]) for r in metrics.get(split, [])]
            if pts:
                ax.plot(*zip(*pts, strict=True), label=label)
        ax.set_title(f"{name}: {FAMILIES[families[name]].selection_loss}")
    for name, metrics in curves.items():
        ls_pts = [(r["step"], r["last_slice_ce"]) for r in metrics.get("validation", [])]
        if ls_pts:
            axes[-1].plot(*zip(*ls_pts, strict=True), label=name)
    axes[-1].set_title("validation LS(T), every run")
    for ax in axes:
        ax.ticklabel_format(axis="y", useOffset=False)
        ax.set_xlabel("step")
        ax.set_ylabel("cross-entropy (nats)")
        ax.grid(alpha=0.3)
        if ax.get_lines():
            ax.legend()
    fig.tight_layout()
    try:
        files.save_figure(fig, workdir, os.path.join("plots", "compare_curves.png"), dpi=100)
    finally:
        plt.close(fig)
