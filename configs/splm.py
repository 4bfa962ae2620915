"""Semantic-simulation LM (seed 004, depth-conditioned Gaussian V_θ) on the built-in corpus, as a
next-token LM over each window's token stream (BOS + S(0..T) + EOS).

    python train.py --config=configs/splm.py --workdir=runs/splm
    python eval.py --workdir=runs/splm --split=validation      # perplexity = exp(window_ce)

Variant: ``--config.model.splm.potential=mlp`` (V_θ an MLP, force by autodiff). The matched
causal-attention token LM (``model_family="baseline_lm"``, the 1-D baseline teacher-forced over the
same streams) is built by ``splm_report.py``; this section holds the SPLM's fields only (no heads,
no dropout). For the Story Cloze stories add
``--config.data.source=file --config.data.path=../shared/data/storycloze_val_2016.csv
--config.tokenizer.lowercase=True --config.tokenizer.min_count=2``.

Expected runtime: about 17 minutes on 2 CPU cores (1,500 steps of 32 windows, d = 64, L = 4; measured
0.6–1.2 s a step).
``python splm_report.py`` runs all three models on both corpora and prints the comparison table.
"""

import ml_collections

from configs import default
from rank4jax.engine.run_config import model_section


def get_config():
    c = default.get_config()
    c.model_family = "splm"
    c.model = model_section("splm", c.model)  # n_tokens, n_slices; no heads, no dropout
    c.model.dx = 8
    c.model.dt = 8  # d = 64
    c.model.n_layers = 4
    c.model.splm = ml_collections.ConfigDict()  # seed 004; width d = dx·dt
    c.model.splm.potential = "gaussian"  # gaussian | mlp
    c.model.splm.xi_alphas = (0.25, 0.5, 0.75, 0.95)  # initial causal-EMA rates, one per ξ channel
    c.model.splm.wells = 8  # K Gaussian wells per ξ bank
    c.model.splm.mlp_hidden = 128  # V_θ MLP hidden width
    c.model.splm.mlp_depth = 3  # V_θ MLP linear layers
    c.model.splm.step = 1.0  # dt of the damped integration step
    c.model.splm.damping = 0.30  # γ
    c.model.splm.lambda_v = 0.01  # weight of mean(V_θ²) in the loss
    c.optim.learning_rate = 3e-3
    c.optim.grad_clip_norm = 1.0
    c.num_steps = 1500
    c.eval_every = 250
    c.checkpoint_every = 500
    return c
