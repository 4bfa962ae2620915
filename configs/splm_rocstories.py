"""The SPLM report's base config on the paper's corpus: 45,000 ROCStories (../shared/data), split
80/10/10 by story hash as ``configs/rocstories.py`` (the same lowercase word vocabulary, V = 14,171),
each story one stream BOS + S(0..4) + EOS at N = 16 (82 slots). The SPLM-Gaussian of
``configs/splm.py`` (d = 64, L = 4, 4 banks of 8 wells); ``splm_report.py`` matches the SPLM-MLP's
hidden width and the attention LM's depth to its parameter count.

    python splm_report.py --config=configs/splm_rocstories.py --workdir=runs/splm_roc
    python train.py --config=configs/splm_rocstories.py --workdir=runs/splm_roc_gaussian   # one model

Expected runtime: about 35 minutes on 2 CPU cores for the three models (600 steps of 32 streams
each, about 53% of an epoch; two validation passes per model).
"""

from configs import rocstories, splm


def get_config():
    c = splm.get_config()
    roc = rocstories.get_config()
    c.data = roc.data  # the ROCStories file, the same split
    c.tokenizer = roc.tokenizer  # lowercase words seen ≥ 3 times in the training split
    c.model.n_tokens = roc.model.n_tokens  # N = 16
    c.num_steps = 600
    c.log_every = 50
    c.eval_every = 300
    c.checkpoint_every = 300
    return c
