"""Run the ZPX seed's experiment plan (standard / angle / angle+sphere / +centre regulariser) for the
rank-4 model and the 1-D baseline on the same windows, and print the table.

    python zpx_plan.py --workdir=runs/zpx_builtin                      # built-in corpus (~8 min)
    python zpx_plan.py --rank4_config=configs/storycloze.py --baseline_config=configs/baseline_storycloze.py \\
        --rank4_config.num_steps=400 --baseline_config.num_steps=400 --workdir=runs/zpx_storycloze

Defaults: configs/default.py for both families (the baseline with the same sizes), 1,000 steps.
Rerunning resumes. Writes zpx_plan.md and zpx_plan.json in the workdir.
"""

from absl import app, flags, logging
from ml_collections import config_flags

from rank4jax.cli import config_flag_errors, config_value, parse_flags, run_reporting_user_errors
from rank4jax.training.zpx_plan import run_plan

with config_flag_errors():
    _RANK4 = config_flags.DEFINE_config_file("rank4_config", "configs/default.py", "Rank-4 run config.")
    _BASELINE = config_flags.DEFINE_config_file("baseline_config", "configs/default.py", "Baseline run config.")
_WORKDIR = flags.DEFINE_string("workdir", "runs/zpx_plan", "Directory holding one run per (family, variant).")
_CENTER = flags.DEFINE_float("center_weight", 0.01, "Centre-cancellation weight of the +centre variant.")
_STEPS = flags.DEFINE_integer("num_steps", 0, "If > 0, overrides num_steps of both configs.")
_SPLIT = flags.DEFINE_enum("split", "test", ["validation", "test"], "Split for the reported LS(T).")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.ERROR)

    def run():
        rank4, base = config_value(_RANK4), config_value(_BASELINE)
        base.model_family = "baseline"
        for config in (rank4, base):
            if _STEPS.value > 0:
                config.num_steps = _STEPS.value
                config.checkpoint_every = config.eval_every = max(1, min(config.eval_every, _STEPS.value))
        return run_plan(
            {"rank4": rank4, "baseline": base}, _WORKDIR.value, center_weight=_CENTER.value, split=_SPLIT.value
        )

    print(run_reporting_user_errors(run)["table"])


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
