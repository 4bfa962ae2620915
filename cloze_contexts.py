"""How the PMI and ending-only Story Cloze accuracies move with the choice of the K stories that lend
their contexts, for K = 8, 32, 64 by default:

    python cloze_contexts.py --workdir=runs/compare_roc/rank4 --cloze_data=../shared/data/storycloze_val_2016.csv

Scores every story's endings after a pool of --pool other stories' contexts once, then draws K of them
--draws times. Writes <workdir>/eval/cloze_contexts_step<N>.json (the table's figures) and .npz (every
story's scores, for further analysis) and prints the table.
"""

from rank4jax.signals import importing

with importing():
    from absl import app, flags, logging

    from rank4jax.cli import no_arguments, parse_flags, run_experiment
    from rank4jax.errors import ConfigError
    from rank4jax.experiments.cloze_contexts import context_spread, spread_markdown, write_spread


_WORKDIR = flags.DEFINE_string("workdir", None, "Workdir of a training run.", required=True)
_CLOZE = flags.DEFINE_string("cloze_data", None, "A Story Cloze CSV.", required=True)
_STEP = flags.DEFINE_string("step", "best", "Checkpoint: 'best', 'latest' or a step.")
_POOL = flags.DEFINE_integer("pool", 128, "P: the other stories whose contexts every story's endings are scored after.")
_KS = flags.DEFINE_list("ks", ["8", "32", "64"], "The numbers of lent contexts K to draw from the pool.")
_DRAWS = flags.DEFINE_integer("draws", 200, "Draws of K lenders per K.")


def main(argv):
    no_arguments(argv)
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.ERROR)

    def spread():
        try:
            ks = tuple(int(k) for k in _KS.value)
        except ValueError:
            raise ConfigError(f"--ks must be whole numbers separated by commas, got {','.join(_KS.value)!r}") from None
        result = context_spread(
            _WORKDIR.value, _CLOZE.value, step=_STEP.value, pool=_POOL.value, ks=ks, draws=_DRAWS.value
        )
        return write_spread(_WORKDIR.value, result)

    run_experiment("context spread", lambda: print(spread_markdown(spread())))


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
