"""Train SPLM-Gaussian, SPLM-MLP and the matched causal-attention token LM on the same token streams
and print the comparison table (validation perplexity, parameters, time per step, the V_θ landscape
statistics and the learned α), beside the model card's TinyStories numbers.

    python splm_report.py --workdir=runs/splm_builtin                      # built-in corpus (~8 min)
    python splm_report.py --config.data.source=file --config.data.path=../shared/data/storycloze_val_2016.csv \\
        --config.tokenizer.lowercase=True --config.tokenizer.min_count=2 --config.model.n_tokens=16 \\
        --workdir=runs/splm_storycloze                                     # Story Cloze stories (~10 min)

The base config (configs/splm.py) sizes the SPLM-Gaussian; the MLP's hidden width and the attention
model's depth are matched to its parameter count. Rerunning resumes. Writes splm_report.json.
"""

from rank4jax.signals import importing

with importing():
    from absl import app, flags, logging
    from ml_collections import config_flags

    from rank4jax.cli import config_flag_errors, config_value, no_arguments, parse_flags, run_experiment
    from rank4jax.experiments.splm_report import run_report


with config_flag_errors(config="configs/splm.py"):
    _CONFIG = config_flags.DEFINE_config_file("config", "configs/splm.py", "Base SPLM run config.")
_WORKDIR = flags.DEFINE_string("workdir", "runs/splm_report", "Directory holding one run per model.")
_LABEL = flags.DEFINE_string("label", "", "Corpus label for the table (default: the data source).")


def main(argv):
    no_arguments(argv)
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.ERROR)
    config = config_value(_CONFIG)
    label = _LABEL.value or (config.data.source if config.data.source == "builtin" else config.data.path.split("/")[-1])
    run_experiment("SPLM report", lambda: print(run_report(config, _WORKDIR.value, label)["table"]))


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
