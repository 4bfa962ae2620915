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

from rank4jax import files
from rank4jax.engine.data_setup import prepare_data
from rank4jax.engine.run_config import model_section
from rank4jax.errors import ConfigError, TrainingDivergedError, say
from rank4jax.evaluation.evaluators import CLOZE_CONTEXTS
from rank4jax.evaluation.report import check_count
from rank4jax.experiments.compare import check_cloze_data
from rank4jax.experiments.families import FAMILIES, RATE_OF
from rank4jax.experiments.ladder_report import plot_ladder, report_markdown, seconds_text
from rank4jax.experiments.ladder_stats import summarise
from rank4jax.experiments.runner import check_experiment_workdir, run_all, stage_dir, train_stage, write_outputs
from rank4jax.models.family import SELECTIONS, run_param_count
from rank4jax.models.sizes import closest
from rank4jax.training.metrics import CONFIG_FILE, SUMMARY_FILE, read_json, read_metrics, training_seconds

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
            f"{figures} | {seconds_text(seconds)} |"
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
