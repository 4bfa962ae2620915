"""The frozen, hashable rank-4 model config (SPEC §11), bound statically under jit."""

from __future__ import annotations

import dataclasses
import numbers

from rank4jax.errors import ConfigError

ATTENTION_MODES = ("autodiff", "analytic")  # "analytic": the §6 hand-derived backward as a custom VJP


def check_positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def check_dropout(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= float(value) < 1.0:
        raise ConfigError(f"{name} must be a number in [0, 1), got {value!r}")
    return float(value)


@dataclasses.dataclass(frozen=True)
class Rank4Config:
    """Sizes of one rank-4 model. Axes: V vocab, N tokens per state, T input slices, dx semantic
    fiber, dt temporal-context fiber, H heads, L layers."""

    vocab_size: int
    n_tokens: int
    n_slices: int
    dx: int
    dt: int
    n_heads: int
    n_layers: int
    dropout: float = 0.1
    attention: str = "autodiff"

    def __post_init__(self):
        for f in ("vocab_size", "n_tokens", "n_slices", "dx", "dt", "n_heads", "n_layers"):
            object.__setattr__(self, f, check_positive_int(f, getattr(self, f)))
        if self.vocab_size < 4:
            raise ConfigError(f"vocab_size must be at least 4 (PAD, UNK, BOS, EOS), got {self.vocab_size}")
        object.__setattr__(self, "dropout", check_dropout("dropout", self.dropout))
        if self.attention not in ATTENTION_MODES:
            raise ConfigError(f"attention must be one of {ATTENTION_MODES}, got {self.attention!r}")

    @property
    def width(self) -> int:
        """D = dx·dt, the flattened joint fiber."""
        return self.dx * self.dt
