"""Evaluate a trained run from its workdir alone (config and tokenizer come from the checkpoint).

python eval.py --workdir=runs/default --split=test [--step=best|latest|N] [--data=other.csv]

``--split=all`` evaluates every story of the file (external test sets have no split of their own):
``--data=../shared/data/storycloze_val_2016.csv --split=all`` scores an official Story Cloze file with
the three scoring rules (mean CE, PMI, ending only). ``--rollout_steps=0`` skips the rollout.
"""

import json
import sys

from rank4jax.signals import importing

with importing():
    from absl import app, flags, logging

    from rank4jax.cli import no_arguments, parse_flags, run_command, terminal_safe
    from rank4jax.errors import say

_WORKDIR = flags.DEFINE_string("workdir", "runs/default", "Workdir of a training run.")
_SPLIT = flags.DEFINE_enum(
    "split", "test", ["train", "validation", "test", "all"], "Split to evaluate; 'all': every story of the file."
)
_STEP = flags.DEFINE_string("step", "best", "Checkpoint: 'best' (lowest validation loss), 'latest' or a step.")
_DATA = flags.DEFINE_string("data", None, "Evaluate on this file's split instead of the run's data.")
_EXAMPLES = flags.DEFINE_integer("examples", 5, "Decoded predictions to show.")
_ROLLOUT = flags.DEFINE_integer(
    "rollout_steps", 1, "Rollout length (SPEC §8; the shipped corpora's 5-sentence stories hold one step); 0 skips it."
)
_DTYPE = flags.DEFINE_string(
    "compute_dtype", None, "float32 or bfloat16 in place of the run's own compute dtype (config.compute_dtype)."
)
_CONTEXTS = flags.DEFINE_integer(
    "cloze_contexts", 8, "K: other stories' contexts estimating an ending's prior (PMI and ending-only rules)."
)


def main(argv):
    no_arguments(argv)
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.ERROR)  # orbax warns on every read-only open
    done = []  # the report, once written: what a Ctrl-C leaves
    run_command(lambda: _evaluate(done), stopped=lambda: "; its report is written" if done else " during the "
                "evaluation; no report was written")  # fmt: skip


def _evaluate(done: list) -> None:
    # JAX and the evaluator import here, after the flags parsed (--help and a bad flag answer at once)
    with importing():
        from rank4jax.evaluation.report import evaluate_run
        from rank4jax.training.metrics import plot_curves

    report = evaluate_run(
        _WORKDIR.value,
        _SPLIT.value,
        _STEP.value,
        _DATA.value,
        _EXAMPLES.value,
        _ROLLOUT.value,
        _CONTEXTS.value,
        _DTYPE.value,
    )
    done.append(report)
    headline = {
        k: report[k]
        for k in (
            "step",
            "split",
            "windows",
            "window_ce",
            "perplexity",
            "last_slice_ce",
            "token_accuracy",
            "last_slice_ce_other_context",
            "context_gain",
        )  # fmt: skip
        if k in report
    }
    for key in ("cloze_stories", "cloze_accuracy", "cloze_accuracy_normalised", "cloze_accuracy_ending_only"):
        if key in report:
            headline[key] = report[key]
    print(json.dumps(headline, indent=2))
    if report.get("examples"):
        print(f"examples (predicted: {report['prediction']}):")
    for ex in report.get("examples", []):  # every example asked for (--examples), as written to the report
        print(f"  gold:      {terminal_safe(ex['gold'])}\n  predicted: {terminal_safe(ex['predicted'])}")
    if "rollout_mean_ce" in report:
        scored = [round(v, 4) for v in report["rollout_mean_ce"] if v is not None]  # steps with a gold sentence
        rest = len(report["rollout_mean_ce"]) - len(scored)
        print(f"rollout mean CE per step: {scored}" + (f" ({rest} later steps: no story that long)" if rest else ""))
    if report.get("write_error"):  # the figures above are all there is: say so, status 1
        say(f"error: {report['write_error']}; the figures above were not saved")
        sys.exit(1)
    print(f"wrote {terminal_safe(report['path'])}")
    plot_curves(_WORKDIR.value)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
