"""The 1-D causal baseline (SPEC §7) on the shared Story Cloze stories, free-running.

    python train.py --config=configs/baseline_storycloze.py --workdir=runs/baseline_storycloze
    python eval.py --workdir=runs/baseline_storycloze --split=test

Same data, tokenizer and windows as ``configs/storycloze.py``; the width (dx·dt = 96 against the
rank-4 model's 128) is chosen so the parameter counts match (~0.52M vs 0.56M at the ~3.1k-word
vocabulary). The logged "window_ce" of this family is its free-running S(T)+EOS selection loss;
"last_slice_ce" is LS(T) over the content tokens of S(T). Expected runtime: about 4 minutes on
2 CPU cores (800 steps; each step decodes N+1 tokens incrementally).
"""

from configs import storycloze
from rank4jax.engine.run_config import model_section


def get_config():
    c = storycloze.get_config()
    c.model_family = "baseline"
    c.model = model_section("baseline", c.model)  # its own fields: no attention mode
    c.model.dx = 12
    c.model.dt = 8
    c.model.n_heads = 2
    c.model.teacher_forcing = False  # True feeds gold tokens: an extra, never the reported comparison
    return c
