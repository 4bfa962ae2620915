"""Flax NNX modules of the rank-4 model over the same pure functions the trainer runs.

    from flax import nnx
    import rank4jax.nn as r4nn

    model = r4nn.Rank4Model(cfg, rngs=nnx.Rngs(0))          # as rank4jax.init_params (SPEC §5)
    logits = model(inputs)                                  # (B, T, N) → (B, N, T, V), = rank4jax.forward
    model = r4nn.from_run(rank4jax.load_run("runs/default"))  # a trained run
    params = model.to_params()                              # the functional tree, exactly

Building blocks for models of your own, on any grid of (dx, dt) fibers: :class:`Rank4Attention`,
:class:`Rank4Block`, :class:`Rank4Embedding`, :class:`Rank4Readout`, :class:`FiberLayerNorm`,
:class:`Rank4MLP`.
"""

from rank4jax.nn.layers import FiberLayerNorm, Rank4Attention, Rank4Block, Rank4Embedding, Rank4MLP, Rank4Readout
from rank4jax.nn.model import Rank4Model, from_run

__all__ = [
    "FiberLayerNorm",
    "Rank4Attention",
    "Rank4Block",
    "Rank4Embedding",
    "Rank4MLP",
    "Rank4Model",
    "Rank4Readout",
    "from_run",
]
