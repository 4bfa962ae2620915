"""The size ladder: each model family at its own learning rate, at several sizes, every run
to its validation optimum, on the same windows.

Families (``FAMILIES``):

- ``rank4``: the paper's model, objective and selection (every target of S(1..T), the validation
  window loss); the reported comparison;
- ``rank4_last``: the same model trained on S(T) alone and selected on the validation LS(T) (an extra);
- ``baseline``: the 1-D causal baseline (SPEC §7), free-running, matched to the rank-4 model's
  parameter count at each rung (the paper's comparison);
- ``baseline_lm``: the same transformer as a standard teacher-forced causal LM over every token of the
  story, matched the same way (``model_family="baseline_lm"``): the reference a reader would pick
  instead. Its LS(T) is teacher-forced (each token of S(T) after the gold ones before it), where the
  rank-4 model predicts every token of S(T) at once and the free-running baseline after its own;
- ``flat``: the rank-4 model's grid with a free D-vector per token (``model.token_code="flat"``) at the
  rung's fiber: the same grid, position codes, joint softmax and parallel prediction without the
  factorised token (an ablation; about 2.2 times the rank-4 model's parameters);
- ``flat_matched``: the flat grid at the fiber whose parameter count is closest to the rank-4 model's
  (``matched_flat_config``; an ablation), trained at the flat grid's rate (``RATE_OF``);
- ``axial``: the rank-4 model with axial attention (``model.attention_grid="axial"``: within each slice,
  then across the slices, with the same maps and parameters; an ablation).

Two stages, each an ordinary set of resumable runs under one workdir:

1. **sweep** (``sweep/<family>_lr<rate>``): every family at the base config's size, once per rate, for
   the same number of steps; each family's rate is the one with the lowest validation selection
   loss (``pick_rates``), unless given.
2. **ladder** (``d<D>/<family>``): every family at every rank-4 fiber width D = dx·dt, at its rate,
   with early stopping (every run to its validation optimum).

A run that diverges (NaN/inf) would diverge again at the same step on every resume, so it is recorded
once (``DIVERGED_FILE``) and the ladder goes on without it: a diverged sweep run loses its family's
sweep, a diverged rung is named in the report with its error and has no figures.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os

import ml_collections
import numpy as np

from rank4jax import files
from rank4jax.engine.data_setup import prepare_data
from rank4jax.engine.run_config import model_section
from rank4jax.errors import ConfigError, TrainingDivergedError, say
from rank4jax.evaluation.evaluators import CLOZE_CONTEXTS
from rank4jax.evaluation.report import check_count
from rank4jax.evaluation.significance import mcnemar_exact, wilson_interval
from rank4jax.experiments.compare import CLOZE_RULES, check_cloze_data
from rank4jax.experiments.runner import check_experiment_workdir, run_all, stage_dir, train_stage, write_outputs
from rank4jax.models.family import SELECTIONS, run_param_count
from rank4jax.models.sizes import closest
from rank4jax.training.metrics import CONFIG_FILE, SUMMARY_FILE, read_json, read_metrics, training_seconds

FAMILIES = {  # name → (model family, what it is)
    "rank4": ("rank4", "rank-4, the paper's objective and selection"),
    "rank4_last": ("rank4", "rank-4, objective S(T) only, selected on LS(T) (extra)"),
    "baseline": ("baseline", "1-D baseline, free-running, parameter-matched"),
    "baseline_lm": ("baseline_lm", "teacher-forced causal LM on every token, parameter-matched (reference)"),
    "flat": ("rank4", "the rank-4 grid with a free D-vector per token, the rung's fiber (ablation)"),
    "flat_matched": ("rank4", "the flat grid at the fiber matching the rank-4 parameter count (ablation)"),
    "axial": ("rank4", "rank-4 with axial attention: within each slice, then across the slices (ablation)"),
}
# families trained at another family's rate when both are in the plan (the same model at another size:
# its sweep would repeat the other's); without that family in the plan, a family sweeps its own
RATE_OF = {"flat_matched": "flat"}
GRID_ABLATIONS = ("flat", "flat_matched", "axial")  # tested against the rank-4 model and the baseline alike
TEACHER_FORCED = frozenset({"baseline_lm"})  # LS(T) after the gold S(T) tokens: no Δ against the free-running ones
DIVERGED_FILE = "diverged.json"  # a run that diverged: its learning rate and error (the ladder goes on without it)
RATES = (3e-4, 1e-3, 3e-3, 1e-2)  # the sweep of docs/scaling.md's reported comparison
WIDTHS = (64, 128, 256)
MATCHED_HEADS = 2  # the baselines' heads at every rung (their width must divide by it)


@dataclasses.dataclass(frozen=True)
class LadderPlan:
    """What the ladder runs: the families, the sweep's rates and steps, the rungs' widths and the
    step cap and patience of the rungs' early stopping."""

    families: tuple[str, ...] = tuple(FAMILIES)
    rates: tuple[float, ...] = RATES
    sweep_steps: int = 4000
    widths: tuple[int, ...] = WIDTHS
    max_steps: int = 60000
    patience: int = 10  # the reported comparison's rule (4 stopped rank-4 runs on noisy plateaus)


def check_plan(plan: LadderPlan) -> None:
    """One ConfigError naming the first bad setting of a plan."""
    if not plan.families or len(set(plan.families)) != len(plan.families):
        raise ConfigError(f"the ladder's families must be distinct and at least one, got {plan.families}")
    if not plan.rates or any(not (r > 0 and math.isfinite(r)) for r in plan.rates):
        raise ConfigError(f"the sweep's learning rates must be positive, finite and at least one, got {plan.rates}")
    if not plan.widths:
        raise ConfigError("the ladder needs at least one width")
    for width in plan.widths:
        fiber(width)
    for name in ("sweep_steps", "max_steps", "patience"):
        if getattr(plan, name) < 1:
            raise ConfigError(f"{name} must be a positive integer, got {getattr(plan, name)}")


def fiber(width: int) -> tuple[int, int]:
    """(dx, dt) of a rank-4 fiber of width D = dx·dt with dx = D/dt and dt the power of two at or above
    sqrt(D/2) (dx:dt between 1:1 and 2:1; the paper's 64:32 is 2:1): 64 → 8·8, 128 → 16·8, 256 → 16·16,
    512 → 32·16."""
    if not isinstance(width, int) or width < 2 or width & (width - 1):
        raise ConfigError(f"a ladder width must be a power of two of at least 2, got {width!r}")
    dt = 2 ** math.ceil(math.log2(math.sqrt(width / 2)))
    return width // dt, dt


def _last_slice(config):
    config.model.objective_slices, config.selection = "last", "last_slice"


def _flat(config):
    config.model.token_code = "flat"


def _axial(config):
    config.model.attention_grid = "axial"


# what each rank-4 family changes in the paper's config (in place); flat_matched is flat at another fiber
VARIANTS = {"rank4": None, "rank4_last": _last_slice, "flat": _flat, "flat_matched": _flat, "axial": _axial}


def rank4_config(base: ml_collections.ConfigDict, width: int, name: str = "rank4") -> ml_collections.ConfigDict:
    """The base rank-4 config at fiber width ``width`` with the family ``name``'s change (``VARIANTS``:
    ``rank4_last`` the S(T) objective and the LS(T) selection, ``flat`` the flat token code, ``axial``
    axial attention)."""
    config = copy.deepcopy(base)
    config.model.dx, config.model.dt = fiber(width)
    if VARIANTS[name] is not None:
        VARIANTS[name](config)
    return config


def matched_flat_config(rank4: ml_collections.ConfigDict, vocab_size: int) -> ml_collections.ConfigDict:
    """The flat grid whose parameter count is closest to the rank-4 config's: D′ from 2 to 2·D, each
    with the ladder's fiber rule (dt′ the power of two at or above sqrt(D′/2), D′ a multiple of it;
    dx′ = D′/dt′). At V = 14,171: 8 × 4 (+5.9 %) at the D = 64 rung, 7 × 8 (−3.5 %) at 128 and 9 × 16
    (+4.1 %) at 256."""
    config = copy.deepcopy(rank4)
    _flat(config)
    target = run_param_count(rank4, vocab_size)

    def with_width(width: int) -> int:
        dt = 2 ** math.ceil(math.log2(math.sqrt(width / 2)))
        config.model.dx, config.model.dt = width // dt, dt
        return run_param_count(config, vocab_size)

    fibers = [w for w in range(2, 2 * base_width(rank4) + 1) if w % 2 ** math.ceil(math.log2(math.sqrt(w / 2))) == 0]
    with_width(closest(fibers, with_width, target))
    return config


def matched_config(rank4: ml_collections.ConfigDict, name: str, vocab_size: int) -> ml_collections.ConfigDict:
    """A baseline family's config (``name``: baseline | baseline_lm) on the rank-4 config's windows, its
    width (a multiple of its heads; dx = D / 2, dt = 2) the one whose parameter count is closest to the
    rank-4 model's."""
    family = FAMILIES[name][0]
    config = copy.deepcopy(rank4)
    config.model_family = family
    extra = {"teacher_forcing": False} if family == "baseline" else {}
    config.model = model_section(family, rank4.model, n_heads=MATCHED_HEADS, **extra)
    target = run_param_count(rank4, vocab_size)

    def with_width(width: int) -> int:
        config.model.dx, config.model.dt = width // 2, 2
        return run_param_count(config, vocab_size)

    width = closest(range(2 * MATCHED_HEADS, 8193, 2 * MATCHED_HEADS), with_width, target)
    with_width(width)
    return config


def family_config(base, name: str, width: int, vocab_size: int) -> ml_collections.ConfigDict:
    if name not in FAMILIES:
        raise ConfigError(f"ladder family must be one of {', '.join(FAMILIES)}, got {name!r}")
    if name == "flat_matched":
        return matched_flat_config(rank4_config(base, width), vocab_size)
    if FAMILIES[name][0] == "rank4":
        return rank4_config(base, width, name)
    return matched_config(rank4_config(base, width), name, vocab_size)


def base_width(base: ml_collections.ConfigDict) -> int:
    return base.model.dx * base.model.dt


def sweep_name(name: str, rate: float) -> str:
    return f"sweep/{name}_lr{rate:g}"


def rung_name(name: str, width: int) -> str:
    return f"d{width}/{name}"


def borrows_rate(name: str, plan: LadderPlan) -> bool:
    """Whether the family trains at another family's rate (``RATE_OF``) in this plan."""
    return RATE_OF.get(name) in plan.families


def sweep_configs(base, plan: LadderPlan, vocab_size: int, given: dict) -> dict:
    """``sweep/<family>_lr<rate>`` → config, at the base size, for each family whose rate is not given
    (nor borrowed: ``RATE_OF``)."""
    configs = {}
    for name in plan.families:
        if name in given or borrows_rate(name, plan):
            continue
        for rate in plan.rates:
            config = family_config(base, name, base_width(base), vocab_size)
            config.optim.learning_rate = rate
            config.num_steps, config.early_stop_patience = plan.sweep_steps, 0
            configs[sweep_name(name, rate)] = config
    return configs


def rung_configs(base, plan: LadderPlan, vocab_size: int, rates: dict) -> dict:
    """``d<D>/<family>`` → config: every family at every width at its rate, with early stopping."""
    configs = {}
    for width in plan.widths:
        for name in plan.families:
            config = family_config(base, name, width, vocab_size)
            config.optim.learning_rate = rates[name]
            config.num_steps, config.early_stop_patience = plan.max_steps, plan.patience
            configs[rung_name(name, width)] = config
        flat, matched = configs.get(rung_name("flat", width)), configs.get(rung_name("flat_matched", width))
        if flat is not None and matched is not None and flat.model == matched.model:
            raise ConfigError(
                f"at D = {width} the matched flat grid is the flat grid itself ({flat.model.dx} × {flat.model.dt}: its "
                "fiber is the one nearest the rank-4 model's parameter count): leave flat_matched out of this ladder"
            )
    return configs


def best_validation(metrics: dict, config: ml_collections.ConfigDict) -> dict | None:
    """The validation record with the lowest selection loss (``config.selection``) among a run's
    logged ``metrics`` (``read_metrics``); None with none."""
    key = SELECTIONS[config.selection]
    return min(metrics.get("validation", []), key=lambda r: r[key], default=None)


def best_selection_loss(run_dir: str, config: ml_collections.ConfigDict) -> float:
    """The lowest validation selection loss a run logged; inf with none."""
    best = best_validation(read_metrics(run_dir), config)
    return math.inf if best is None else best[SELECTIONS[config.selection]]


def pick_rates(losses: dict, plan: LadderPlan, given: dict) -> dict:
    """Each family's rate: the given one, else the sweep rate with the lowest validation selection
    loss (``losses``: sweep run name → that loss; ``inf`` for a run that diverged), else (``RATE_OF``)
    the rate of the family it borrows from. A family whose every sweep run diverged has no rate to
    pick: refused by name, not trained at a rate that diverged."""
    rates = dict(given)
    for name in plan.families:
        if name not in rates and not borrows_rate(name, plan):
            rates[name] = min(plan.rates, key=lambda r, n=name: losses[sweep_name(n, r)])
            if math.isinf(losses[sweep_name(name, rates[name])]):
                tried = ", ".join(f"{r:g}" for r in plan.rates)
                raise ConfigError(
                    f"every sweep run of {name} diverged (learning rates {tried}): give it a rate with "
                    f"--learning_rates={name}=RATE, or sweep lower --rates in another --workdir"
                )
    for name in plan.families:
        rates.setdefault(name, rates.get(RATE_OF.get(name)))
    return rates


def plan_runs(base, workdir: str, plan: LadderPlan, given: dict, vocab_size: int) -> tuple[dict, dict | None]:
    """(sweep configs, rung configs) — the rungs None while a sweep run they need has not finished."""
    sweep = sweep_configs(base, plan, vocab_size, given)
    losses = {}
    for name, config in sweep.items():
        run_dir = os.path.join(workdir, name)
        finished = _finished_step(run_dir) == config.num_steps
        losses[name] = math.inf if diverged(run_dir) else best_selection_loss(run_dir, config) if finished else None
    rungs = None
    if all(loss is not None for loss in losses.values()):
        rungs = rung_configs(base, plan, vocab_size, pick_rates(losses, plan, given))
    check_trained_rates(workdir, {**sweep, **(rungs or {})})
    return sweep, rungs


def check_trained_rates(workdir: str, runs: dict) -> None:
    """Refuses a plan that gives a run another learning rate than the one it was trained at: a rung's
    name does not carry its rate, so the run would be reported at a rate it never trained with."""
    for name, config in runs.items():
        optim = (read_json(os.path.join(workdir, name, CONFIG_FILE), "the run's config") or {}).get("optim")
        trained = optim.get("learning_rate") if isinstance(optim, dict) else None
        if isinstance(trained, int | float) and trained != config.optim.learning_rate:
            raise ConfigError(
                f"{name} in {workdir} was trained at learning rate {trained:g}, but this ladder gives it "
                f"{config.optim.learning_rate:g} (the sweep's pick or --learning_rates): use another --workdir, "
                "or move that run aside to train it again"
            )


def diverged(run_dir: str) -> dict | None:
    """What a run that diverged left (``DIVERGED_FILE``: its error), or None."""
    return read_json(os.path.join(run_dir, DIVERGED_FILE), "the run's divergence record")


def train_run(name: str, config: ml_collections.ConfigDict, run_dir: str) -> dict | None:
    """Train (or resume) one run of the ladder: its summary, or None for one that diverged, now or
    before. Resuming a diverged run diverges again at the same step, so its error is kept in
    ``DIVERGED_FILE`` and the ladder goes on without it (a diverged sweep run loses its sweep; a
    diverged rung has no figures)."""
    if (record := diverged(run_dir)) is not None:
        first = str(record.get("error", "no error recorded")).split(". ")[0]
        say(f"rank4jax: {name} diverged before ({first}); skipped (delete its {DIVERGED_FILE} to retry)")
        return None
    try:
        return train_stage(name, config, run_dir)
    except TrainingDivergedError as e:
        files.write_json(run_dir, DIVERGED_FILE, {"learning_rate": config.optim.learning_rate, "error": str(e)})
        say(f"rank4jax: {name} {e}; the ladder goes on without it")
        return None


def _finished_step(run_dir: str) -> int | None:
    """The step a run's summary says it ended at (None: no summary yet)."""
    return (read_json(os.path.join(run_dir, SUMMARY_FILE), "the run's summary") or {}).get("step")


def ladder(base, workdir: str, plan: LadderPlan, *, given=None, only=None, evaluate=None) -> dict | None:
    """Train what is not finished — the sweep, then the rungs at the picked rates — and, unless
    ``only`` names one run to train, evaluate every rung (``evaluate(rungs, rates)`` → the report).
    ``given``: family → learning rate, for families that skip the sweep."""
    given = dict(given or {})
    check_experiment_workdir(workdir)
    vocab_size = prepare_data(base, None).tokenizer.vocab_size
    sweep, rungs = plan_runs(base, workdir, plan, given, vocab_size)
    known = {**sweep, **(rungs or {})}
    if only is not None:
        if only not in known:
            hint = "" if rungs is not None else " (the rungs are known once the sweep has finished)"
            raise ConfigError(f"--only={only!r} is not a run of this ladder{hint}; its runs: {', '.join(known)}")
        train_run(only, known[only], stage_dir(workdir, only))
        return None
    for name, config in sweep.items():
        train_run(name, config, stage_dir(workdir, name))
    sweep, rungs = plan_runs(base, workdir, plan, given, vocab_size)
    return evaluate(workdir, rungs) if evaluate is not None else None


def status(base, workdir: str, plan: LadderPlan, given=None) -> str:
    """A markdown table of every run the ladder knows so far (the rungs once the sweep has finished):
    the step it reached, its best validation selection loss with the step and LS(T) there, and its
    logged training time. Reads the runs' logs only: nothing is trained or compiled."""
    given = dict(given or {})
    check_experiment_workdir(workdir)
    if not os.path.isdir(workdir):
        raise ConfigError(f"--workdir={workdir}: no ladder there yet (nothing has been trained in it)")
    sweep, rungs = plan_runs(base, workdir, plan, given, prepare_data(base, None).tokenizer.vocab_size)
    lines = [
        "| run | lr | step | best selection loss (step) | LS(T) there | training s |",
        "|---|---|---|---|---|---|",
    ]
    for name, config in {**sweep, **(rungs or {})}.items():
        metrics, key = read_metrics(os.path.join(workdir, name)), SELECTIONS[config.selection]
        best = best_validation(metrics, config)
        steps = [r["step"] for r in metrics.get("train", [])]
        seconds = training_seconds(metrics["train"], config.batch_size) if steps else None
        figures = "— | —" if best is None else f"{best[key]:.4f} ({best['step']}) | {best['last_slice_ce']:.4f}"
        gone = " (diverged)" if diverged(os.path.join(workdir, name)) else ""
        lines.append(
            f"| {name} | {config.optim.learning_rate:g} | {max(steps, default=0)}{gone} / {config.num_steps} | "
            f"{figures} | {_seconds(seconds)} |"
        )
    if rungs is None:
        lines.append("\nThe rungs are known once every sweep run has finished.")
    return "\n".join(lines)


def evaluator(split: str = "test", cloze_data: str | None = None, cloze_contexts: int = CLOZE_CONTEXTS, config=None):
    """``evaluate(workdir, rungs)``: train what is left of the rungs, evaluate each selected checkpoint
    on ``split`` (and every story of ``cloze_data``), write ladder.json, ladder.md and the plot.
    ``config``: the base run config, whose training data ``cloze_data`` must not be (as compare.py)."""
    if cloze_data is not None and not os.path.isfile(cloze_data):
        raise ConfigError(f"--cloze_data: file not found: {cloze_data}")
    if config is not None:
        check_cloze_data(cloze_data, config)
    check_count("--cloze_contexts", cloze_contexts)  # before any training, not after it

    def evaluate(workdir: str, rungs: dict) -> dict:
        options = {"num_examples": 0, "rollout_steps": 0, "cloze_contexts": cloze_contexts}  # every evaluation's
        extra = {"cloze": {"split": "all", "data_path": cloze_data} | options} if cloze_data else None
        runs = run_all(rungs, workdir, split=split, extra_evals=extra, train=train_run, **options)
        gone = {name: diverged(os.path.join(workdir, name)) for name in rungs if name not in runs}
        result = summarise(runs, split) | {"cloze_data": cloze_data, "diverged": gone}
        result["table"] = report_markdown(result)
        write_outputs(workdir, "ladder", result, result["table"])
        plot_ladder(result, workdir)
        return result

    return evaluate


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


def _seconds(value) -> str:
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
            f"{_seconds(row['training_time_to_best_s'])} | {row['ms_per_step']:.1f} | "
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
