"""Semantic-simulation LM (seed 004, depth-conditioned Gaussian V_θ) on the built-in corpus, as a
next-token LM over each window's token stream (BOS + S(0..T) + EOS).

    python train.py --config=configs/splm.py --workdir=runs/splm
    python eval.py --workdir=runs/splm --split=validation      # perplexity = exp(window_ce)

Variants: ``--config.model.splm.potential=mlp`` (V_θ an MLP, force by autodiff);
``--config.model_family=baseline_lm`` (the matched causal-attention token LM: the 1-D baseline
teacher-forced over the same streams). For the Story Cloze stories add
``--config.data.source=file --config.data.path=../shared/data/storycloze_val_2016.csv
--config.tokenizer.lowercase=True --config.tokenizer.min_count=2``.

Expected runtime: about 3 minutes on 2 CPU cores (1,500 steps of 32 windows, d = 64, L = 4).
``python splm_report.py`` runs all three models on both corpora and prints the comparison table.
"""

from configs import default


def get_config():
    c = default.get_config()
    c.model_family = "splm"
    c.model.dx = 8
    c.model.dt = 8  # d = 64
    c.model.n_heads = 2  # used by the matched attention model only
    c.model.n_layers = 4
    c.model.dropout = 0.0
    c.optim.learning_rate = 3e-3
    c.optim.grad_clip_norm = 1.0
    c.num_steps = 1500
    c.eval_every = 250
    c.checkpoint_every = 500
    return c
