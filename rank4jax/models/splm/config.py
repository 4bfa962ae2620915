"""Config of the semantic-simulation language model (seed 004), frozen and hashable."""

from __future__ import annotations

import dataclasses
import math
import numbers

from rank4jax.errors import ConfigError
from rank4jax.models.sizes import check_positive_int, validate_window_model

POTENTIALS = ("mlp", "gaussian")


@dataclasses.dataclass(frozen=True)
class SPLMConfig:
    """Axes: V vocabulary, d = dx·dt hidden width, L layers (integration steps), K_ξ context
    channels, K wells per bank. ``n_tokens``/``n_slices`` size the window packed into one stream.
    No heads and no dropout: the integration is deterministic."""

    vocab_size: int | None  # None: validated before the vocabulary is known (no model can be built)
    n_tokens: int
    n_slices: int
    dx: int
    dt: int
    n_layers: int
    potential: str = "gaussian"  # mlp | gaussian
    xi_alphas: tuple = (0.25, 0.5, 0.75, 0.95)  # initial EMA rates, one per ξ channel
    wells: int = 8  # K wells per ξ bank (gaussian)
    mlp_hidden: int = 128  # hidden width of the V_θ MLP (mlp)
    mlp_depth: int = 3  # linear layers of the V_θ MLP
    step: float = 1.0  # dt of the damped integration
    damping: float = 0.30  # γ
    lambda_v: float = 0.01  # weight of mean(V_θ²) in the loss
    xi_stop_gradient: bool = True  # False only for the causal-leak probe's negative control

    def __post_init__(self):
        validate_window_model(self)
        if self.potential not in POTENTIALS:
            raise ConfigError(f"splm.potential must be one of {POTENTIALS}, got {self.potential!r}")
        alphas = tuple(float(a) for a in self.xi_alphas)
        if not alphas or any(not 0.0 < a < 1.0 for a in alphas):
            raise ConfigError(f"splm.xi_alphas must be numbers in (0, 1), got {self.xi_alphas!r}")
        object.__setattr__(self, "xi_alphas", alphas)
        for name in ("wells", "mlp_hidden", "mlp_depth"):
            object.__setattr__(self, name, check_positive_int(f"splm.{name}", getattr(self, name)))
        if self.mlp_depth < 2:
            raise ConfigError("splm.mlp_depth must be at least 2 (a hidden layer and the scalar output)")
        for name in ("step", "damping", "lambda_v"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
                raise ConfigError(f"splm.{name} must be a finite non-negative number, got {value!r}")
            object.__setattr__(self, name, float(value))
        if self.step <= 0:
            raise ConfigError("splm.step must be positive")

    @property
    def width(self) -> int:
        """d = dx·dt."""
        return self.dx * self.dt

    @property
    def xi_channels(self) -> int:
        return len(self.xi_alphas)
