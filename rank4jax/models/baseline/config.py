"""Config of the 1-D causal baseline (SPEC §7), frozen and hashable."""

from __future__ import annotations

import dataclasses

from rank4jax.errors import ConfigError
from rank4jax.models.scores import STANDARD
from rank4jax.models.sizes import validate_window_model


@dataclasses.dataclass(frozen=True)
class BaselineConfig:
    """Same window sizes as the rank-4 model; width D = dx·dt split into H heads of width D/H.

    ``teacher_forcing``: feed the gold previous target token instead of the model's own argmax.
    An extra for diagnostics; the paper's comparison is free-running (False)."""

    vocab_size: int | None  # None: validated before the vocabulary is known (no model can be built)
    n_tokens: int
    n_slices: int
    dx: int
    dt: int
    n_heads: int
    n_layers: int
    dropout: float = 0.1
    teacher_forcing: bool = False
    score: object = STANDARD  # attention-score variant (rank4jax.models.scores): the paper's, or a ZPXConfig

    def __post_init__(self):
        validate_window_model(self)
        if self.width % self.n_heads:
            raise ConfigError(f"the width dx·dt = {self.width} is not divisible by n_heads = {self.n_heads}")

    @property
    def width(self) -> int:
        return self.dx * self.dt

    @property
    def context_slots(self) -> int:
        """Lc = 1 + T·N: BOS plus every token of the T context sentences."""
        return 1 + self.n_slices * self.n_tokens

    @property
    def target_slots(self) -> int:
        """N + 1: the tokens of S(T) and EOS."""
        return self.n_tokens + 1
