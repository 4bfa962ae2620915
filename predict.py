"""Predict the next sentence of a story with a trained run (any model family).

    python predict.py --workdir=runs/default "sentence 1" "sentence 2" "sentence 3" "sentence 4"
    python predict.py --workdir=RUN --rollout=2 "..." "..." "..." "..."      # two more states after it
    python predict.py --workdir=RUN --temperature=0.8 --top_k=20 "..." ...   # sampled (decoding families)

The model reads the last T sentences (T of the run: 4 in the shipped configs). It prints them as its
tokenizer reads them ([UNK:word]: a word outside the vocabulary), then each predicted state with
every token's probability, and says what the prediction is: the rank-4 model's is the per-position
argmax of S(T), every token at once; the baseline decodes S(T) free-running; the stream LMs decode it
token by token.
"""

from rank4jax.signals import importing

with importing():
    from absl import app, flags, logging

    from rank4jax.cli import parse_flags, run_command, terminal_safe

_WORKDIR = flags.DEFINE_string("workdir", "runs/default", "Workdir of a training run.")
_STEP = flags.DEFINE_string("step", "best", "Checkpoint: 'best', 'latest' or a step.")
_ROLLOUT = flags.DEFINE_integer("rollout", 0, "Further states to predict, each after the previous prediction.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "Sampling temperature of the decoding families (0: greedy).")
_TOP_K = flags.DEFINE_integer("top_k", 0, "Sample from the k most likely tokens only (with --temperature).")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the sampling.")


def _predict(sentences):
    with importing():
        from rank4jax.prediction import predict_next
        from rank4jax.runs import load_run

    run = load_run(_WORKDIR.value, _STEP.value if not _STEP.value.isdigit() else int(_STEP.value))
    return run, predict_next(run, sentences, _ROLLOUT.value, _TEMPERATURE.value, _TOP_K.value, _SEED.value)


def main(argv):
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.ERROR)
    run, prediction = run_command(lambda: _predict(argv[1:]), " during the prediction")
    t = run.model_cfg.n_slices
    print(f"{_WORKDIR.value}: {run.family.name} model, step {run.step}; it reads the last {t} sentences")
    if prediction.dropped:
        print(f"({prediction.dropped} earlier sentence(s) not read)")
    for i, text in enumerate(prediction.inputs):
        print(f"  S({i}): {terminal_safe(text)}")
    if prediction.unknown or prediction.cut:
        print(f"  ({prediction.unknown} word(s) outside the vocabulary; {prediction.cut} sentence(s) cut to N tokens)")
    print(f"prediction: {prediction.kind}")
    for k, state in enumerate(prediction.states):
        print(f"  Ŝ({t + k}): {terminal_safe(state.text) or '(nothing: the model ended the sentence at once)'}")
        print("         " + " ".join(f"{terminal_safe(piece)} ({prob:.2f})" for piece, prob in state.tokens))


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
