"""Run the ZPX seed's experiment plan (standard / angle / angle+sphere / +centre regulariser) for the
rank-4 model and the 1-D baseline on the same windows, and print the table.

    python zpx_plan.py --workdir=runs/zpx_builtin                      # built-in corpus (~8 min)
    python zpx_plan.py --rank4_config=configs/storycloze.py --baseline_config=configs/baseline_storycloze.py \\
        --rank4_config.num_steps=400 --baseline_config.num_steps=400 --workdir=runs/zpx_storycloze
    python zpx_plan.py --rank4_config=configs/rocstories.py --baseline_config=configs/baseline_rocstories.py \\
        --rank4_config.num_steps=800 --baseline_config.num_steps=1300 --seeds=0,1 --workdir=runs/zpx_roc
                                                       # ROCStories, 2 seeds (~2 h; docs/zpx.md)

Defaults: configs/default.py for both families (the baseline with the same sizes), 1,000 steps.
Rerunning resumes. Writes zpx_plan.md and zpx_plan.json in the workdir; with ``--seeds`` one plan
per seed in ``<workdir>/seed<s>`` and the combined table (mean ± half-range) in zpx_seeds.md/.json.
"""

from rank4jax.signals import importing

with importing():
    from absl import app, flags, logging
    from ml_collections import config_flags

    from rank4jax.cli import config_flag_errors, config_value, no_arguments, parse_flags, run_experiment
    from rank4jax.engine.run_config import model_section
    from rank4jax.errors import ConfigError
    from rank4jax.experiments.zpx_plan import run_plan, run_seeds


with config_flag_errors(rank4_config="configs/default.py", baseline_config="configs/default.py"):
    _RANK4 = config_flags.DEFINE_config_file("rank4_config", "configs/default.py", "Rank-4 run config.")
    _BASELINE = config_flags.DEFINE_config_file("baseline_config", "configs/default.py", "Baseline run config.")
_WORKDIR = flags.DEFINE_string("workdir", "runs/zpx_plan", "Directory holding one run per (family, variant).")
_CENTER = flags.DEFINE_float("center_weight", 0.01, "Centre-cancellation weight of the +centre variant.")
_STEPS = flags.DEFINE_integer("num_steps", 0, "If > 0, overrides num_steps of both configs.")
_SPLIT = flags.DEFINE_enum("split", "test", ["validation", "test"], "Split for the reported LS(T).")
_SEEDS = flags.DEFINE_list("seeds", [], "Run the plan once per seed (sets both configs' seed), then combine.")


def main(argv):
    no_arguments(argv)
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.ERROR)

    def run():
        rank4, base = config_value(_RANK4), config_value(_BASELINE)
        if base.model_family != "baseline":  # a rank-4 config file (the default): its sizes, the baseline's fields
            base.model_family = "baseline"
            base.model = model_section("baseline", base.model)
        for config in (rank4, base):
            if _STEPS.value > 0:
                config.num_steps = _STEPS.value
                config.checkpoint_every = config.eval_every = max(1, min(config.eval_every, _STEPS.value))
        bases, kwargs = {"rank4": rank4, "baseline": base}, {"center_weight": _CENTER.value, "split": _SPLIT.value}
        if _SEEDS.value:
            try:
                seeds = [int(s) for s in _SEEDS.value]
            except ValueError:
                raise ConfigError(
                    f"--seeds must be integers separated by commas, got {','.join(_SEEDS.value)}"
                ) from None
            return run_seeds(bases, _WORKDIR.value, seeds, **kwargs)
        return run_plan(bases, _WORKDIR.value, **kwargs)

    run_experiment("ZPX plan", lambda: print(run()["table"]))


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
