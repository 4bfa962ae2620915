"""rank4jax: a functional JAX reimplementation of the 4-tensor (rank-4) attention model.

Public API (SPEC §11)::

    cfg = rank4jax.Rank4Config(vocab_size, n_tokens, n_slices, dx, dt, n_heads, n_layers)
    params = rank4jax.init_params(key, cfg)
    logits = rank4jax.forward(params, inputs, cfg)          # inputs (B, T, N) → (B, N, T, V)
    metrics = rank4jax.window_losses(logits, targets)      # targets (B, T, N)
    flat = rank4jax.export_params(params, cfg); params = rank4jax.import_params(flat, cfg)
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

__all__ = [
    "Rank4Config",
    "count_params",
    "export_params",
    "forward",
    "import_params",
    "init_params",
    "window_losses",
]
__version__ = "0.1.0"
