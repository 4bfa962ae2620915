"""The 1-D causal baseline (SPEC §7) on the paper's corpus, free-running, matched to
``configs/rocstories.py``: the same data, split, tokenizer and windows (T = 4, N = 16).

    python train.py --config=configs/baseline_rocstories.py --workdir=runs/baseline_rocstories
    python eval.py --workdir=runs/baseline_rocstories --split=test

Expected runtime: 53 minutes on 2 CPU cores (measured: 3,194 s for 11,000 steps of 32 windows,
22 validation passes included). The selection loss (free-running S(T)+EOS) is lowest at step
9,000 (47 minutes; validation LS(T) 5.648) and only fluctuates after. Short variant for a quick
check: ``--config.num_steps=1500`` (5.5 minutes measured; validation LS(T) 5.943).

Width D = dx·dt = 60 (dx = 10, dt = 6), H = 2 heads of 30, L = 2: 937,860 parameters against the
rank-4 model's 914,784 at V = 14,171 (+2.5%). The baseline's tied token table costs V·D, so at a
word vocabulary matching the parameter count makes it narrower than the rank-4 fiber (as in the
paper, where its table holds 75M of 176M parameters). The logged "window_ce" of this family is its
free-running S(T)+EOS selection loss; "last_slice_ce" is LS(T) over the content tokens of S(T).
"""

from configs import rocstories
from rank4jax.engine.run_config import model_section


def get_config():
    c = rocstories.get_config()
    c.model_family = "baseline"
    c.model = model_section("baseline", c.model)  # its own fields: no attention mode
    c.model.dx = 10
    c.model.dt = 6
    c.model.n_heads = 2
    c.model.teacher_forcing = False  # True feeds gold tokens: an extra, never the reported comparison
    c.num_steps = 11000  # its step is cheaper (D = 60): more steps in the same hour
    return c
