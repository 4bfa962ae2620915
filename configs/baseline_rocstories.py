"""The 1-D causal baseline (SPEC §7) on the paper's corpus, free-running, matched to
``configs/rocstories.py``: the same data, split, tokenizer and windows (T = 4, N = 16).

    python train.py --config=configs/baseline_rocstories.py --workdir=runs/baseline_rocstories
    python eval.py --workdir=runs/baseline_rocstories --split=test

Short variant for a quick check: ``--config.num_steps=1800`` (about 8 minutes).

Width D = dx·dt = 60 (dx = 10, dt = 6), H = 2 heads of 30, L = 2: 938,040 parameters against the
rank-4 model's 915,328 at V = 14,171 (+2.5%). The baseline's tied token table costs V·D, so at a
word vocabulary matching the parameter count makes it narrower than the rank-4 fiber (as in the
paper, where its table holds 75M of 176M parameters). The logged "window_ce" of this family is its
free-running S(T)+EOS selection loss; "last_slice_ce" is LS(T) over the content tokens of S(T).
"""

from configs import rocstories


def get_config():
    c = rocstories.get_config()
    c.model_family = "baseline"
    c.model.dx = 10
    c.model.dt = 6
    c.model.n_heads = 2
    c.model.teacher_forcing = False  # True feeds gold tokens: an extra, never the reported comparison
    return c
