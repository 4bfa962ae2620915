"""The size ladder: each model family at its own learning rate (a short sweep), then at
several rank-4 fiber widths D = dx·dt, every run to its validation optimum; evaluates every selected
checkpoint and writes ladder.md, ladder.json and plots/ladder.png (``rank4jax.experiments.ladder``).

    # the whole ladder on the 45,000 ROCStories (many hours on 2 CPU cores; rerun to resume)
    python ladder.py --workdir=runs/ladder --cloze_data=../shared/data/storycloze_val_2016.csv

    # one run only (spread the runs over machines or jobs, then evaluate them together with the first command)
    python ladder.py --workdir=runs/ladder --only=sweep/rank4_lr0.001
    python ladder.py --workdir=runs/ladder --only=d256/baseline

    # where every run stands, from the runs' logs (trains nothing)
    python ladder.py --workdir=runs/ladder --status

    # skip the sweep for families whose rate is known
    python ladder.py --workdir=runs/ladder --learning_rates=rank4=1e-3,baseline=1e-3

Families: rank4 (the paper's objective and selection), rank4_last (S(T) objective, LS(T) selection:
an extra), baseline (free-running, parameter-matched: the paper's comparison), baseline_lm (a
teacher-forced causal LM on every token, parameter-matched: the reference); the grid ablations flat
(a free D-vector per token on the rung's fiber), flat_matched (the flat grid matched to the rank-4
parameter count, at the flat grid's rate) and axial (within each slice, then across the slices).
"""

from rank4jax.signals import importing

with importing():
    import math

    from absl import app, flags, logging
    from ml_collections import config_flags

    from rank4jax.cli import config_flag_errors, config_value, no_arguments, parse_flags, run_experiment
    from rank4jax.errors import ConfigError
    from rank4jax.experiments import ladder as lad


with config_flag_errors(config="configs/rocstories.py"):
    _CONFIG = config_flags.DEFINE_config_file("config", "configs/rocstories.py", "The base rank-4 run config.")
_WORKDIR = flags.DEFINE_string("workdir", "runs/ladder", "Directory holding every run of the ladder.")
_FAMILIES = flags.DEFINE_list("families", list(lad.FAMILIES), f"Families, of {', '.join(lad.FAMILIES)}.")
_RATES = flags.DEFINE_list("rates", [f"{r:g}" for r in lad.RATES], "The sweep's learning rates.")
_SWEEP_STEPS = flags.DEFINE_integer("sweep_steps", lad.LadderPlan.sweep_steps, "Steps of every sweep run.")
_WIDTHS = flags.DEFINE_list("widths", [str(w) for w in lad.WIDTHS], "The rank-4 fiber widths D = dx·dt.")
_MAX_STEPS = flags.DEFINE_integer("max_steps", lad.LadderPlan.max_steps, "Step cap of every rung.")
_PATIENCE = flags.DEFINE_integer("patience", lad.LadderPlan.patience, "Early stopping patience of the rungs.")
_GIVEN = flags.DEFINE_list("learning_rates", [], "family=rate pairs: those families skip the sweep.")
_ONLY = flags.DEFINE_string("only", None, "Train this one run (e.g. sweep/rank4_lr0.001, d256/baseline), then stop.")
_SPLIT = flags.DEFINE_enum("split", "test", ["validation", "test"], "Split for the reported LS(T).")
_CLOZE = flags.DEFINE_string("cloze_data", "", "A Story Cloze CSV (not the training data) every rung is scored on.")
_CONTEXTS = flags.DEFINE_integer("cloze_contexts", 8, "K lent contexts of the PMI and ending-only rules.")
_STATUS = flags.DEFINE_bool("status", False, "Print where every run of the ladder stands (from its logs) and exit.")


def _numbers(flag, values, kind):
    try:
        return tuple(kind(v) for v in values)
    except ValueError:
        raise ConfigError(f"--{flag} must be a list of numbers, got {','.join(values)!r}") from None


def _plan() -> lad.LadderPlan:
    unknown = [f for f in _FAMILIES.value if f not in lad.FAMILIES]
    if unknown:
        raise ConfigError(f"--families: unknown family {unknown[0]!r}; the families: {', '.join(lad.FAMILIES)}")
    plan = lad.LadderPlan(
        families=tuple(_FAMILIES.value),
        rates=_numbers("rates", _RATES.value, float),
        sweep_steps=_SWEEP_STEPS.value,
        widths=_numbers("widths", _WIDTHS.value, int),
        max_steps=_MAX_STEPS.value,
        patience=_PATIENCE.value,
    )
    lad.check_plan(plan)
    return plan


def _given() -> dict:
    given = {}
    for pair in _GIVEN.value:
        name, _, rate = pair.partition("=")
        if name in given:
            raise ConfigError(f"--learning_rates: {name} is given twice")
        if name not in lad.FAMILIES:
            raise ConfigError(f"--learning_rates: unknown family {name!r} in {pair!r}")
        given[name] = _numbers("learning_rates", [rate], float)[0]
        if not (given[name] > 0 and math.isfinite(given[name])):
            raise ConfigError(f"--learning_rates: {name}'s rate must be positive and finite, got {rate}")
    return given


def main(argv):
    no_arguments(argv)
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.ERROR)

    def go():
        if _STATUS.value:
            return {"table": lad.status(config_value(_CONFIG), _WORKDIR.value, _plan(), _given())}
        base = config_value(_CONFIG)
        evaluate = lad.evaluator(_SPLIT.value, _CLOZE.value or None, _CONTEXTS.value, config=base)
        plan, given = _plan(), _given()
        return lad.ladder(base, _WORKDIR.value, plan, given=given, only=_ONLY.value, evaluate=evaluate)

    def go_and_print():
        result = go()
        if result is not None:
            print(result["table"])

    run_experiment("ladder", go_and_print)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
