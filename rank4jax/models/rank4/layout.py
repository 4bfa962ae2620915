"""Where the rank-4 model's stream sits: rows of positions, and the map to each window's (x, t) grid.

Axes: G groups, R rows per group, R_t rows with a target, W windows per group, P = N·T positions
of a window (p = x·T + t), D = dx·dt, F any feature width.

Every position-wise part of the model (embedding, LayerNorms, Q/K/V maps, MLP, readout) runs on
rows; only the joint softmax needs a window's positions side by side, so attention moves Q, K and
V to the (G·W, P) grid and the summed head outputs back (:meth:`Rows.to_grid`, :meth:`Rows.from_grid`).
One model serves two layouts:

- **windows** (:func:`window_rows`): the rows are the grid, G = B, W = 1, R = R_t = P; the moves are
  reshapes. Windows may be trimmed to N' ≤ N token columns (``rank4jax.data.windows.trim_padding``):
  the position tables are read at x < N', and the cut columns were PAD keys with PAD targets.
- **compact** (:func:`compact_rows`, built on the host by ``rank4jax.data.compact.compact_windows``):
  only the positions whose input or target is not PAD, the rows with a target first; the moves are
  gathers (:func:`move_rows`), and a position left out of a window is a zero row there, a masked key.

Dropout draws the windows layout's (B, P, D) keep mask and, on a compact batch, reads it at each
row's grid slot, so both layouts compute exactly the same loss and gradient (tested in float64).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import jax
import jax.numpy as jnp

from rank4jax.models.common import apply_keep_mask, keep_mask
from rank4jax.tokens import PAD_ID


def _gather_rows(x: jax.Array, index: jax.Array) -> jax.Array:
    """x (G, M, F), index (G, M') in [0, M] → (G, M', F); index M reads a zero row."""
    padded = jnp.concatenate([x, jnp.zeros_like(x[:, :1])], axis=1)
    return jnp.take_along_axis(padded, index[..., None], axis=1)


@jax.custom_vjp
def move_rows(x: jax.Array, index: jax.Array, inverse: jax.Array) -> jax.Array:
    """x (G, M, F) → (G, M', F) with out[g, j] = x[g, index[g, j]] (zero where index = M).

    ``inverse`` (G, M) is the inverse map (inverse[g, index[g, j]] = j, M' where a row is unused):
    the backward pass is then the gather ``move_rows(g, inverse, index)``, not a scatter-add."""
    return _gather_rows(x, index)


def _move_rows_fwd(x, index, inverse):
    return _gather_rows(x, index), (index, inverse)


def _move_rows_bwd(residuals, cotangent):
    index, inverse = residuals
    return _gather_rows(cotangent, inverse), None, None


move_rows.defvjp(_move_rows_fwd, _move_rows_bwd)


@dataclasses.dataclass(frozen=True)
class Rows:
    """A batch as rows: tokens, position x and slice t (G, R); targets (G, R_t) or None; the grid
    map ``grid`` (G, W, P) and its inverse ``slot`` (G, R), both None when the rows are the grid."""

    tokens: jax.Array
    position: jax.Array
    slice: jax.Array
    n_positions: int  # P of the grid
    targets: jax.Array | None = None
    grid: jax.Array | None = None
    slot: jax.Array | None = None

    @property
    def n_windows(self) -> int:
        """G·W, the windows of the batch."""
        return self.tokens.shape[0] if self.grid is None else self.grid.shape[0] * self.grid.shape[1]

    def to_grid(self, x: jax.Array) -> jax.Array:
        """Rows (G, R, F) → (G·W, P, F), zero at the positions left out."""
        if self.grid is None:
            return x
        groups = self.grid.shape[0]
        moved = move_rows(x, self.grid.reshape(groups, -1), self.slot)
        return moved.reshape(self.n_windows, self.n_positions, x.shape[-1])

    def from_grid(self, x: jax.Array) -> jax.Array:
        """(G·W, P, F) → rows (G, R, F)."""
        if self.grid is None:
            return x
        groups = self.grid.shape[0]
        return move_rows(x.reshape(groups, -1, x.shape[-1]), self.slot, self.grid.reshape(groups, -1))

    def key_mask(self) -> jax.Array:
        """(G·W, P) bool: a key wherever the grid holds an input token."""
        return self.to_grid(self.tokens[..., None])[..., 0] != PAD_ID

    def dropout(self, x: jax.Array, rate: float, keys: jax.Array | None) -> jax.Array:
        """Inverted dropout of rows (G, R, D) with the windows layout's (G·W, P, D) keep mask, window w's
        drawn from ``keys[w]`` (G·W,); None (eval mode) or a zero rate: x unchanged."""
        if keys is None or rate == 0.0:
            return x
        keep = keep_mask(keys, (self.n_windows, self.n_positions, x.shape[-1]), rate)
        if self.grid is not None:  # the mask at each row's slot (filler rows read any slot)
            slot = jnp.minimum(self.slot, self.n_windows // self.grid.shape[0] * self.n_positions - 1)
            keep = keep.reshape(self.grid.shape[0], -1, x.shape[-1])
            keep = jnp.take_along_axis(keep, slot[..., None], axis=1)
        return apply_keep_mask(x, keep, rate)


class OnGrid:
    """The layout of a stream that already is its windows' grids (B, P, D), as ``rank4jax.rank4_block``
    and ``rank4jax.nn`` take it: nothing moves, and dropout is :meth:`Rows.dropout` of full windows."""

    @staticmethod
    def to_grid(x: jax.Array) -> jax.Array:
        return x

    @staticmethod
    def from_grid(x: jax.Array) -> jax.Array:
        return x

    @staticmethod
    def dropout(x: jax.Array, rate: float, keys: jax.Array | None) -> jax.Array:
        if keys is None or rate == 0.0:
            return x
        return apply_keep_mask(x, keep_mask(keys, x.shape, rate), rate)


ON_GRID = OnGrid()


def window_rows(inputs: jax.Array, targets: jax.Array | None = None) -> Rows:
    """inputs (B, T, N') = S(0..T-1), targets (B, T, N') = S(1..T) or None → rows (B, P = N'·T)."""
    batch, n_slices, n_tokens = inputs.shape
    flat = jnp.arange(n_tokens * n_slices)

    def as_rows(states):  # (B, T, N') → (B, P), p = x·T + t
        return jnp.swapaxes(states, 1, 2).reshape(batch, -1)

    return Rows(
        tokens=as_rows(inputs),
        position=jnp.broadcast_to(flat // n_slices, (batch, flat.size)),
        slice=jnp.broadcast_to(flat % n_slices, (batch, flat.size)),
        n_positions=flat.size,
        targets=None if targets is None else as_rows(targets),
    )


def compact_rows(batch: Mapping) -> Rows:
    """A compact batch (``rank4jax.data.compact``) as rows."""
    return Rows(
        tokens=batch["tokens"],
        position=batch["position"],
        slice=batch["slice"],
        n_positions=batch["grid"].shape[2],
        targets=batch["targets"],
        grid=batch["grid"],
        slot=batch["slot"],
    )


def training_rows(batch) -> Rows:
    """A training batch — windows (B, T+1, N') or a compact batch (a mapping) — as rows with targets."""
    if isinstance(batch, Mapping):
        return compact_rows(batch)
    return window_rows(batch[:, :-1], batch[:, 1:])
