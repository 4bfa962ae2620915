"""rank4jax: a functional JAX reimplementation of the 4-tensor (rank-4) attention model.

Public API (SPEC §11)::

    cfg = rank4jax.Rank4Config(vocab_size, n_tokens, n_slices, dx, dt, n_heads, n_layers)
    params = rank4jax.init_params(key, cfg)
    logits = rank4jax.forward(params, inputs, cfg)          # inputs (B, T, N) → (B, N, T, V)
    metrics = rank4jax.window_losses(logits, targets)      # targets (B, T, N)
    flat = rank4jax.export_params(params, cfg); params = rank4jax.import_params(flat, cfg)
    run = rank4jax.load_run("runs/default")                 # a trained run: params, model_cfg, tokenizer, …
    logits = rank4jax.forward(run.params, inputs, run.model_cfg)
    prediction = rank4jax.predict_next(run, sentences)     # the next sentence, any family

The layer on its own, for models of your own on any grid of (dx, dt) fibers::

    layer = rank4jax.init_layer(key, dx, dt, n_heads)        # {ln_attn, attn, ln_mlp, mlp}
    x = rank4jax.rank4_block(layer, x, mask)                 # one Pre-LN layer (SPEC §3–§4): the one the model runs
    out = rank4jax.rank4_attention(layer["attn"], x, mask)   # x (B, *grid, dx, dt), mask (B, *grid) or (B, [H,] P, K)
    a = rank4jax.rank4_attention_weights(layer["attn"], x, mask)  # (B, H, *grid, *grid)

Flax NNX modules over the same functions: ``rank4jax.nn`` (``Rank4Model``, ``Rank4Block``, …).
"""

import importlib

_HOMES = {  # each public name's module, imported on first use: ``import rank4jax.signals`` stays light
    **dict.fromkeys(
        (
            "Rank4Config",
            "count_params",
            "export_params",
            "forward",
            "import_params",
            "init_layer",
            "init_params",
            "rank4_attention",
            "rank4_attention_weights",
            "rank4_block",
            "window_losses",
        ),
        "rank4jax.models.rank4",
    ),
    "load_run": "rank4jax.runs",
    "predict_next": "rank4jax.prediction",
}


def __getattr__(name):
    if name not in _HOMES:
        raise AttributeError(f"module 'rank4jax' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value


__all__ = sorted(_HOMES)
__version__ = "0.1.0"
