"""The 1-D causal baseline on ROCStories at the paper's own width rule: D = dx·dt = 128, the width
of the rank-4 fiber of ``configs/rocstories.py`` (the paper sizes its baseline at D = 2,048 = 64·32
the same way). Everything else as ``configs/baseline_rocstories.py`` (H = 2, L = 2, free-running).

    python train.py --config=configs/baseline_rocstories_wide.py --workdir=runs/baseline_rocstories_wide
    python eval.py --workdir=runs/baseline_rocstories_wide --split=test

At V = 14,171 the tied token table is V·D, so this baseline has 2,209,664 parameters, 2.4× the rank-4
model's 914,784 (the parameter-matched baseline: D = 60, 937,860). Expected runtime: about 65
minutes on 2 CPU cores for the same 11,000 steps as the parameter-matched baseline (measured: its
step trains 99 windows/s against that baseline's 169; ``--config.num_steps=300`` took 2 min 4 s,
data loading and one validation pass included, validation LS(T) 6.212).
"""

from configs import baseline_rocstories


def get_config():
    c = baseline_rocstories.get_config()
    c.model.dx = 16  # D = dx·dt = 128: the rank-4 fiber's width
    c.model.dt = 8
    return c
