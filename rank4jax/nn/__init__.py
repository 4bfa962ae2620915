"""Flax NNX modules of the rank-4 model over the same pure functions the trainer runs.

    from flax import nnx
    import rank4jax.nn as r4nn

    model = r4nn.Rank4Model(cfg, rngs=nnx.Rngs(params=0, dropout=1))   # as rank4jax.init_params (SPEC §5)
    logits = model(inputs)                            # (B, T, N) → (B, N, T, V), dropout from rngs.dropout
    model.eval(); logits = model(inputs)              # = rank4jax.forward(model.to_params(), inputs, cfg)
    model = r4nn.from_run(rank4jax.load_run("runs/default"))  # a trained run, in eval mode

**What the block is.** A rank-4 layer (:class:`Rank4Block`) is Pre-LN, full-width multi-head
attention over the flattened key grid with D-vector tokens (D = dx·dt), its H heads summed with no
output map, then a GELU MLP on the flattened fiber: every map is dense over the whole fiber and the
one softmax ignores where a cell sits, so a (6, 8) grid of (4, 4) fibers is a 48-cell grid of
(16, 1) fibers to it. What is rank-4 is the token code Esem ⊗ Etmp (:class:`Rank4Embedding` for
token ids, :class:`OuterProductEmbed` for continuous features), the position codes P[x] + R[x + t]
of an (N, T) grid (:func:`position_codes`) and the factorised readout (:class:`Rank4Readout`,
:class:`FactorisedReadout`). Its cost: 3·H·D² attention parameters a layer, against standard
attention's 4·D² (50M a layer at the paper's D = 2,048, H = 4).

Building blocks for models of one's own, on any grid of (dx, dt) fibers: :class:`Rank4Attention`,
:class:`Rank4Block`, :class:`FiberLayerNorm`, :class:`Rank4MLP`, with flax's habits (keyword-only
``rngs``, ``.train()`` / ``.eval()``, ``dtype`` / ``param_dtype``, ``kernel_init``, optional and
broadcastable ``mask``, ``is_causal``, weights by ``sow``, the trainer's partition as metadata).
"""

from rank4jax.nn.codes import (
    FactorisedReadout,
    OuterProductEmbed,
    Rank4Embedding,
    Rank4Readout,
    position_codes,
)
from rank4jax.nn.layers import FiberLayerNorm, Rank4Attention, Rank4Block, Rank4MLP
from rank4jax.nn.model import Rank4Model, from_run

__all__ = [
    "FactorisedReadout",
    "FiberLayerNorm",
    "OuterProductEmbed",
    "Rank4Attention",
    "Rank4Block",
    "Rank4Embedding",
    "Rank4MLP",
    "Rank4Model",
    "Rank4Readout",
    "from_run",
    "position_codes",
]
