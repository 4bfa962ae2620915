"""Train the rank-4 model and the 1-D causal baseline on the same windows and compare them like
the paper's Table 5 (LS(T), Δ, parameters, wall time) with curves like its Figures 2–4.

    python compare.py --workdir=runs/compare   # Story Cloze stories, matched parameter counts
    python compare.py --rank4_config=configs/storycloze.py --baseline_config=configs/baseline_storycloze.py \\
        --rank4_config.num_steps=400 --baseline_config.num_steps=400 --workdir=runs/compare_short

    # the paper's corpus (45,000 ROCStories), scored on all 1,571 Story Cloze stories too (about 2 h)
    python compare.py --rank4_config=configs/rocstories.py --baseline_config=configs/baseline_rocstories.py \\
        --cloze_data=../shared/data/storycloze_val_2016.csv --workdir=runs/compare_roc

    # the paper's width rule as a third run (D = dx·dt = 128) beside the parameter-matched baseline
    python compare.py --rank4_config=configs/rocstories.py --baseline_config=configs/baseline_rocstories.py \\
        --baseline_wide_config=configs/baseline_rocstories_wide.py \\
        --cloze_data=../shared/data/storycloze_val_2016.csv --workdir=runs/compare_roc

Rerunning resumes the runs. Writes compare.md, compare.json and plots/compare_curves.png.
"""

from rank4jax.signals import importing

with importing():
    from absl import app, flags, logging
    from ml_collections import config_flags

    from rank4jax.cli import config_flag_errors, config_value, no_arguments, parse_flags, run_experiment
    from rank4jax.experiments.compare import compare


with config_flag_errors(rank4_config="configs/storycloze.py", baseline_config="configs/baseline_storycloze.py"):
    _RANK4 = config_flags.DEFINE_config_file("rank4_config", "configs/storycloze.py", "Rank-4 run config.")
    _BASELINE = config_flags.DEFINE_config_file(
        "baseline_config", "configs/baseline_storycloze.py", "Baseline run config."
    )
    _WIDE = config_flags.DEFINE_config_file(
        "baseline_wide_config", None, "Optional third run: the baseline at the paper's width rule (D = dx·dt)."
    )
_WORKDIR = flags.DEFINE_string(
    "workdir", "runs/compare", "Directory holding the rank4/, baseline/ (and baseline_wide/) runs."
)
_SPLIT = flags.DEFINE_enum("split", "test", ["validation", "test"], "Split for the reported LS(T).")
_CONTEXTS = flags.DEFINE_integer(
    "cloze_contexts", 8, "K: other stories' contexts estimating an ending's prior (PMI and ending-only rules)."
)
_CLOZE = flags.DEFINE_string(
    "cloze_data",
    "",
    "A Story Cloze CSV (not the training data) whose every story both models are scored on, by the three rules "
    "(mean CE, PMI, ending only).",
)


def main(argv):
    no_arguments(argv)
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.ERROR)

    def go():
        wide = config_value(_WIDE) if _WIDE.value is not None else None
        result = compare(config_value(_RANK4), config_value(_BASELINE), _WORKDIR.value, _SPLIT.value,
                         _CLOZE.value or None, _CONTEXTS.value, wide)  # fmt: skip
        print(result["table"])

    run_experiment("comparison", go)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
