"""The rank-4 (4-tensor) attention model of SPEC.md."""

from rank4jax.models.rank4.attention import rank4_attention, rank4_attention_weights
from rank4jax.models.rank4.block import init_layer, rank4_block, sublayer
from rank4jax.models.rank4.config import Rank4Config
from rank4jax.models.rank4.export import canonical_shapes, export_params, import_params
from rank4jax.models.rank4.layout import Rows, compact_rows, window_rows
from rank4jax.models.rank4.losses import (
    last_slice_mean_ce,
    readout_loss_sums,
    window_loss_sums,
    window_losses,
)
from rank4jax.models.rank4.model import (
    attention_maps,
    count_params,
    forward,
    hidden_rows,
    hidden_states,
    init_params,
    loss_sums,
    next_state_logits,
)

__all__ = [
    "Rank4Config",
    "Rows",
    "attention_maps",
    "canonical_shapes",
    "compact_rows",
    "count_params",
    "export_params",
    "forward",
    "hidden_rows",
    "hidden_states",
    "import_params",
    "init_layer",
    "init_params",
    "last_slice_mean_ce",
    "loss_sums",
    "next_state_logits",
    "rank4_attention",
    "rank4_attention_weights",
    "rank4_block",
    "sublayer",
    "readout_loss_sums",
    "window_loss_sums",
    "window_losses",
    "window_rows",
]
