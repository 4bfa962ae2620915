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
"""

from rank4jax.models.rank4 import (
    Rank4Config,
    count_params,
    export_params,
    forward,
    import_params,
    init_params,
    window_losses,
)


def __getattr__(name):  # load_run pulls in orbax and the trainer: imported on first use only
    if name == "load_run":
        from rank4jax.runs import load_run

        return load_run
    if name == "predict_next":
        from rank4jax.prediction import predict_next

        return predict_next
    raise AttributeError(f"module 'rank4jax' has no attribute {name!r}")


__all__ = [
    "Rank4Config",
    "count_params",
    "export_params",
    "forward",
    "import_params",
    "init_params",
    "load_run",
    "predict_next",
    "window_losses",
]
__version__ = "0.1.0"
