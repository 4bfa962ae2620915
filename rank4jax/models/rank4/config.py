"""The frozen, hashable rank-4 model config (SPEC §11), bound statically under jit: the sizes, and the
one place the model's variants are received (:attr:`Rank4Config.tokens`, :attr:`Rank4Config.sublayer`)."""

from __future__ import annotations

import dataclasses

from rank4jax.errors import ConfigError
from rank4jax.models.rank4 import block
from rank4jax.models.rank4.block import ATTENTION_GRIDS, ATTENTION_MODES
from rank4jax.models.rank4.codes import TOKEN_CODES as CODES
from rank4jax.models.scores import STANDARD
from rank4jax.models.sizes import validate_window_model

# the slices the training loss covers: "all" S(1..T) (the paper, SPEC §4) or "last" S(T) only (an
# extra: with no temporal mask the targets S(1..T-1) are visible in the input, so "all" is 3/4 copies)
OBJECTIVE_SLICES = ("all", "last")
TOKEN_CODES = tuple(CODES)  # "outer", the paper's Esem ⊗ Etmp, or "flat", a free vector per token (an ablation)
__all__ = ["ATTENTION_GRIDS", "ATTENTION_MODES", "OBJECTIVE_SLICES", "TOKEN_CODES", "Rank4Config"]


@dataclasses.dataclass(frozen=True)
class Rank4Config:
    """Sizes of one rank-4 model. Axes: V vocab, N tokens per state, T input slices, dx semantic
    fiber, dt temporal-context fiber, H heads, L layers."""

    vocab_size: int | None  # None: validated before the vocabulary is known (no model can be built)
    n_tokens: int
    n_slices: int
    dx: int
    dt: int
    n_heads: int
    n_layers: int
    dropout: float = 0.1
    attention: str = "autodiff"
    score: object = STANDARD  # attention-score variant (rank4jax.models.scores): the paper's, or a ZPXConfig
    objective_slices: str = "all"  # OBJECTIVE_SLICES: what the training objective averages over
    token_code: str = "outer"  # TOKEN_CODES: how a token enters and leaves the fiber (rank4.codes)
    attention_grid: str = "joint"  # ATTENTION_GRIDS: one softmax over N·T keys (the paper's) or two hops (.axial)

    def __post_init__(self):
        validate_window_model(self)
        if self.objective_slices not in OBJECTIVE_SLICES:
            raise ConfigError(f"objective_slices must be one of {OBJECTIVE_SLICES}, got {self.objective_slices!r}")
        if self.token_code not in TOKEN_CODES:
            raise ConfigError(f"token_code must be one of {TOKEN_CODES}, got {self.token_code!r}")
        self.sublayer  # noqa: B018 -- the attention variants' own checks

    @property
    def tokens(self):
        """The token code (``rank4jax.models.rank4.codes``) this config names."""
        return CODES[self.token_code]

    @property
    def sublayer(self) -> block.Sublayer:
        """How each layer's attention half runs (``block.sublayer``): the paper's (``block.PAPER``), or
        the variant that ``attention``, ``score`` and ``attention_grid`` name."""
        return block.sublayer(self.attention, self.score, self.attention_grid, self.n_slices)

    @property
    def width(self) -> int:
        """D = dx·dt, the flattened joint fiber."""
        return self.dx * self.dt
