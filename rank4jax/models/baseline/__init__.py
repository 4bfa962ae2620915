"""The 1-D causal transformer baseline of SPEC §7 (free-running decoding with a K/V cache)."""

from rank4jax.models.baseline.config import BaselineConfig
from rank4jax.models.baseline.model import (
    content_mean_ce,
    count_params,
    decode,
    full_logits,
    init_params,
    pack,
    stream_logits,
    target_sums,
)

__all__ = [
    "BaselineConfig",
    "content_mean_ce",
    "count_params",
    "decode",
    "full_logits",
    "init_params",
    "pack",
    "stream_logits",
    "target_sums",
]
