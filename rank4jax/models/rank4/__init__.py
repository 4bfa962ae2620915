"""The rank-4 (4-tensor) attention model of SPEC.md."""

from rank4jax.models.rank4.compact import compact_loss_sums
from rank4jax.models.rank4.config import Rank4Config
from rank4jax.models.rank4.export import canonical_shapes, export_params, import_params
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
    hidden_states,
    hidden_states_and_center,
    init_params,
    next_state_logits,
)

__all__ = [
    "Rank4Config",
    "attention_maps",
    "canonical_shapes",
    "compact_loss_sums",
    "count_params",
    "export_params",
    "forward",
    "hidden_states",
    "hidden_states_and_center",
    "import_params",
    "init_params",
    "last_slice_mean_ce",
    "next_state_logits",
    "readout_loss_sums",
    "window_loss_sums",
    "window_losses",
]
