"""Train a rank4jax model. Rerun the same command to resume from the latest checkpoint.

python train.py --config=configs/default.py --workdir=runs/default [--config.num_steps=2000 ...]
python train.py --config=configs/rocstories.py --print_config   # every config key, resolved; trains nothing

Each run writes its resolved config to <workdir>/config.json.
"""

import os
import sys

from rank4jax.signals import importing

with importing():
    from absl import app, flags, logging
    from ml_collections import config_flags

    from rank4jax.cli import config_flag_errors, config_value, no_arguments, parse_flags, run_command

with config_flag_errors(config="configs/default.py"):
    _CONFIG = config_flags.DEFINE_config_file("config", "configs/default.py", "Run config file (configs/*.py).")
_WORKDIR = flags.DEFINE_string("workdir", "runs/default", "Directory for checkpoints, metrics and plots.")
_DISTRIBUTED = flags.DEFINE_bool(
    "distributed", False, "Multi-host: call jax.distributed.initialize() first (one process per host)."
)
_COORDINATOR = flags.DEFINE_string("coordinator_address", None, "host:port of process 0 (auto-detected on TPU/SLURM).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Number of processes (auto-detected if unset).")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index (auto-detected if unset).")
_PRINT_CONFIG = flags.DEFINE_bool(
    "print_config", False, "Print the resolved config (every key, with the --config.* overrides) and exit."
)


def main(argv):
    # JAX and the trainer import here, after the flags parsed: --help and a bad flag or config file answer at once
    with importing():
        from rank4jax.engine.run_config import validate
        from rank4jax.training.loop import train

    no_arguments(argv)
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
    if _PRINT_CONFIG.value:
        config = run_command(lambda: config_value(_CONFIG))
        run_command(lambda: validate(config))  # a bad value: one error line, as training says it
        print(config.to_json(indent=2))
        return
    if _DISTRIBUTED.value:
        import jax

        jax.distributed.initialize(
            coordinator_address=_COORDINATOR.value, num_processes=_NUM_PROCESSES.value, process_id=_PROCESS_ID.value
        )
    summary = run_command(lambda: train(config_value(_CONFIG), _WORKDIR.value), stopped=_saved)
    if summary["interrupted"]:  # SIGTERM: its checkpoint is saved
        sys.exit(143)


def _saved() -> str:
    """What a Ctrl-C leaves: the latest checkpoint of the workdir (a save in flight has finished)."""
    checkpoints = os.path.join(_WORKDIR.value, "checkpoints")
    steps = sorted(int(n) for n in (os.listdir(checkpoints) if os.path.isdir(checkpoints) else []) if n.isdigit())
    if not steps:
        return "; no checkpoint was saved"
    return f"; checkpoint {steps[-1]} of {_WORKDIR.value} is saved: rerun the same command to resume from it"


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
