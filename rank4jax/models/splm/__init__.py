"""The semantic-simulation language model (seed 004): damped particle dynamics in a learned potential."""

from rank4jax.models.splm.config import SPLMConfig
from rank4jax.models.splm.model import (
    alphas,
    causal_ema,
    count_params,
    count_potential_params,
    force,
    forward,
    init_params,
    potential_value,
    set_surprisal,
    trajectory,
    unigram_surprisal,
)

__all__ = [
    "SPLMConfig",
    "alphas",
    "causal_ema",
    "count_params",
    "count_potential_params",
    "force",
    "forward",
    "init_params",
    "potential_value",
    "set_surprisal",
    "trajectory",
    "unigram_surprisal",
]
