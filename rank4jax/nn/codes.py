"""The rank-4 parts around the block, as Flax NNX modules: the token code (token ids, or continuous
features of any grid, as outer products of a semantic and a temporal factor), the paper's position
codes on an (N, T) grid, and the factorised readout (tied to a vocabulary, or free for any targets).

Axes: B batch, N positions within a state (x), T states (t), a grid of any shape, dx/dt fibers,
D = dx·dt, V vocabulary, F input features, O outputs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from rank4jax.models.common import fan_in_uniform
from rank4jax.models.rank4.codes import apply_embedding, apply_readout, grid_position_tables, init_readout
from rank4jax.models.rank4.config import Rank4Config
from rank4jax.nn.common import cast, check_stream, compute_dtype, initial, param, params_key
from rank4jax.nn.layers import check_sizes


def position_codes(grid: tuple[int, ...], dx: int, dt: int, dtype=jnp.float32) -> jax.Array:
    """The paper's fixed position codes of an (N, T) grid (SPEC §2 Stages B and D), (N, T, dx, dt):
    P[x] over the semantic fiber (the same for every q) plus R[x + t] over the temporal fiber (the same
    for every n); x the position within a state (grid axis 0), t the state (axis 1). Exactly what
    :class:`Rank4Embedding` adds to the stories' tokens. Add it to a stream of that grid. A 1-axis grid
    (N,) is the (N, 1) grid's codes, (N, dx, dt); the code is defined for these two ranks only."""
    if not isinstance(grid, tuple | list) or len(grid) not in (1, 2):
        raise ValueError(
            f"position_codes: grid must be (N, T) or (N,), the paper's position code's grids; got {grid!r}"
        )
    n_tokens, n_slices = (tuple(grid) + (1,))[:2]
    check_sizes("position_codes", n_tokens=n_tokens, n_slices=n_slices, dx=dx, dt=dt)
    spatial, joint = grid_position_tables(n_tokens, n_slices, dx, dt, dtype)  # P (N, dx), R[x+t] (N, T, dt)
    codes = jnp.asarray(spatial)[:, None, :, None] + jnp.asarray(joint)[:, :, None, :]  # (N, T, dx, dt)
    return codes if len(grid) == 2 else codes[:, 0]


class Rank4Embedding(nnx.Module):
    """The stories' input tensor (SPEC §2, Stages A–D): X = Esem[tok] ⊗ Etmp[tok] + P[x] + R[x + t].

    Parameters Esem (V, dx) and Etmp (V, dt), N(0, 1) with the PAD row zero."""

    def __init__(self, cfg: Rank4Config, *, dtype=None, param_dtype=jnp.float32, rngs=None, params=None):
        params = initial(
            params, rngs, lambda key: cfg.tokens.init_embed(key, cfg.vocab_size, cfg.dx, cfg.dt, param_dtype)
        )
        self.cfg, self.dtype = cfg, dtype
        self.sem = param(params["sem"], "embed", "sem", "Rank4Embedding")  # Esem (V, dx)
        self.tmp = param(params["tmp"], "embed", "tmp", "Rank4Embedding")  # Etmp (V, dt)

    @classmethod
    def from_params(cls, params: dict, cfg: Rank4Config, **options) -> Rank4Embedding:
        return cls(cfg, params=params, **options)

    def to_params(self) -> dict:
        return {"sem": self.sem.get_value(), "tmp": self.tmp.get_value()}

    def __call__(self, inputs: jax.Array) -> jax.Array:
        """inputs (B, T, N) token ids, the states S(0..T−1) as ``rank4jax.forward`` takes them → X
        (B, N, T, dx, dt)."""
        cfg = self.cfg
        check_tokens(inputs, cfg, "Rank4Embedding")
        params = self.to_params()
        params = cast(params, compute_dtype(self.dtype, *params.values()))
        return apply_embedding(params, jnp.swapaxes(inputs, 1, 2), cfg)  # (B, N, T, dx, dt)


def check_tokens(inputs, cfg: Rank4Config, owner: str) -> None:
    """Token ids (B, T, N) of the config's window, integers."""
    shape = getattr(inputs, "shape", None)
    if shape is None or len(shape) != 3 or tuple(shape[1:]) != (cfg.n_slices, cfg.n_tokens):
        raise ValueError(
            f"{owner}: inputs must be token ids (B, T, N) = (B, {cfg.n_slices}, {cfg.n_tokens}), the states "
            f"S(0..T-1) one per row, got shape {shape}"
        )
    if not jnp.issubdtype(inputs.dtype, jnp.integer):
        raise ValueError(f"{owner}: inputs must be integer token ids, got {inputs.dtype}")


class OuterProductEmbed(nnx.Module):
    """The paper's token code for continuous inputs: features (B, *grid, F) → fibers (B, *grid, dx, dt),
    each the outer product of two learned projections, (x·Wsem + bsem) ⊗ (x·Wtmp + btmp), as a token is
    Esem[v] ⊗ Etmp[v]. Wsem (F, dx) and Wtmp (F, dt) by ``kernel_init`` (SPEC's U(±1/sqrt(F))), biases
    zero. Add :func:`position_codes` for the paper's positions on an (N, T) grid."""

    def __init__(
        self,
        in_features: int,
        dx: int,
        dt: int,
        *,
        use_bias: bool = True,
        dtype=None,
        param_dtype=jnp.float32,
        kernel_init=fan_in_uniform,
        rngs: nnx.Rngs,
    ):
        check_sizes("OuterProductEmbed", in_features=in_features, dx=dx, dt=dt)
        k_sem, k_tmp = jax.random.split(params_key(rngs))
        self.in_features, self.fiber, self.dtype = in_features, (dx, dt), dtype
        owner = "OuterProductEmbed"
        self.sem = param(kernel_init(k_sem, (in_features, dx), param_dtype), "features", "sem", owner)  # Wsem (F, dx)
        self.tmp = param(kernel_init(k_tmp, (in_features, dt), param_dtype), "features", "tmp", owner)  # Wtmp (F, dt)
        self.sem_bias = param(jnp.zeros((dx,), param_dtype), "features", "sem_bias", owner) if use_bias else None
        self.tmp_bias = param(jnp.zeros((dt,), param_dtype), "features", "tmp_bias", owner) if use_bias else None

    def __call__(self, x: jax.Array) -> jax.Array:
        """x (B, *grid, F) → (B, *grid, dx, dt)."""
        shape = getattr(x, "shape", None)
        if shape is None or len(shape) < 3 or shape[-1] != self.in_features:
            raise ValueError(
                f"OuterProductEmbed: x must be (B, *grid, F) = (B, ..., {self.in_features}) with at least one "
                f"grid axis, got shape {shape}"
            )
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(f"OuterProductEmbed: x must be floating features, got {x.dtype}")
        weights = [v.get_value() for v in (self.sem, self.tmp, self.sem_bias, self.tmp_bias) if v is not None]
        dtype = compute_dtype(self.dtype, x, *weights)
        x = x.astype(dtype)
        sem = x @ self.sem.get_value().astype(dtype)  # (B, *grid, dx)
        tmp = x @ self.tmp.get_value().astype(dtype)  # (B, *grid, dt)
        if self.sem_bias is not None:
            sem, tmp = sem + self.sem_bias.get_value().astype(dtype), tmp + self.tmp_bias.get_value().astype(dtype)
        return sem[..., :, None] * tmp[..., None, :]  # (B, *grid, dx, dt)


class Rank4Readout(nnx.Module):
    """The tied, factorised readout (SPEC §4): logits[v] = Σ_{n,q} Y[n, q]·Esem[v, n]·W′[v, q].

    Holds W′ (V, dt) ~ N(0, 1/D); Esem is the embedding's, passed at the call (tied)."""

    def __init__(
        self, vocab_size: int, dx: int, dt: int, *, dtype=None, param_dtype=jnp.float32, rngs=None, params=None
    ):
        check_sizes("Rank4Readout", vocab_size=vocab_size, dx=dx, dt=dt)
        params = initial(params, rngs, lambda key: init_readout(key, vocab_size, dt, dx * dt, param_dtype))
        self.fiber, self.dtype = (dx, dt), dtype
        self.tmp = param(params["tmp"], "readout", "tmp", "Rank4Readout")  # W′ (V, dt)

    def to_params(self) -> dict:
        return {"tmp": self.tmp.get_value()}

    def __call__(self, y: jax.Array, sem: jax.Array) -> jax.Array:
        """y (B, *grid, dx, dt) final-normed stream, sem (V, dx) the tied factor → logits (B, *grid, V)."""
        check_stream(y, self.fiber, "Rank4Readout", "y")
        if getattr(sem, "shape", None) != (self.tmp.shape[0], self.fiber[0]):
            raise ValueError(
                f"Rank4Readout: sem must be (V, dx) = {(self.tmp.shape[0], self.fiber[0])}, got {sem.shape}"
            )
        return factorised_logits(y, sem, self.tmp.get_value(), self.dtype)


class FactorisedReadout(nnx.Module):
    """The factorised readout for any targets: out[o] = Σ_{n,q} Y[n, q]·A[o, n]·B[o, q], O outputs each
    scored by an outer product as the vocabulary is (A (O, dx) ~ N(0, 1), B (O, dt) ~ N(0, 1/D), as
    Esem and W′), untied. y (B, *grid, dx, dt) → (B, *grid, O)."""

    def __init__(self, dx: int, dt: int, out_features: int, *, dtype=None, param_dtype=jnp.float32, rngs: nnx.Rngs):
        check_sizes("FactorisedReadout", dx=dx, dt=dt, out_features=out_features)
        k_sem, k_tmp = jax.random.split(params_key(rngs))
        self.fiber, self.dtype = (dx, dt), dtype
        sem = jax.random.normal(k_sem, (out_features, dx), param_dtype)
        self.sem = param(sem, "outputs", "sem", "FactorisedReadout")  # A (O, dx)
        tmp = init_readout(k_tmp, out_features, dt, dx * dt, param_dtype)["tmp"]
        self.tmp = param(tmp, "outputs", "tmp", "FactorisedReadout")  # B (O, dt)

    def __call__(self, y: jax.Array) -> jax.Array:
        """y (B, *grid, dx, dt) → (B, *grid, O)."""
        check_stream(y, self.fiber, "FactorisedReadout", "y")
        return factorised_logits(y, self.sem.get_value(), self.tmp.get_value(), self.dtype)


def factorised_logits(y: jax.Array, sem: jax.Array, tmp: jax.Array, dtype=None) -> jax.Array:
    """y (B, *grid, dx, dt) against the factors sem (O, dx), tmp (O, dt) → (B, *grid, O)."""
    dtype = compute_dtype(dtype, y, sem, tmp)
    flat = y.astype(dtype).reshape(y.shape[0], -1, y.shape[-2] * y.shape[-1])  # (B, P, D)
    logits = apply_readout(sem.astype(dtype), tmp.astype(dtype), flat)  # (B, P, O)
    return logits.reshape(y.shape[:-2] + logits.shape[-1:])  # (B, *grid, O)
