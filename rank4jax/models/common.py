"""Building blocks shared by every model family: sinusoid tables, LayerNorm, dropout, GELU MLP,
the one masked softmax.

All functions are pure and follow the dtype of their inputs/parameters.

Axes: D model width (a flattened fiber), F = 4·D MLP hidden width.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

LN_EPSILON = 1e-5  # SPEC §3 [choice]


def count_params(init_fn, cfg) -> int:
    """Parameter count of ``init_fn(key, cfg)`` from ``jax.eval_shape`` (nothing is allocated)."""
    shapes = jax.eval_shape(lambda: init_fn(jax.random.key(0), cfg))
    return sum(int(leaf.size) for leaf in jax.tree_util.tree_leaves(shapes))


def masked_softmax(scores: jax.Array, mask: jax.Array) -> jax.Array:
    """The joint softmax of every attention in the project, over the last axis (the keys): masked
    keys get the dtype's finite minimum score, so they have zero weight unless every key of the
    query is masked (its weights are then uniform, never NaN). ``mask`` broadcasts to ``scores``."""
    return jax.nn.softmax(jnp.where(mask, scores, jnp.finfo(scores.dtype).min), axis=-1)


def sinusoid_table(n_positions: int, dim: int) -> np.ndarray:
    """Fixed sinusoid table (SPEC §2), float64 numpy of shape (n_positions, dim).

    table[p, 2i] = sin(p / 10000^{2i/d}), table[p, 2i+1] = cos(p / 10000^{2i/d}); for odd ``dim``
    the last column is a sine.
    """
    pos = np.arange(n_positions, dtype=np.float64)[:, None]
    two_i = np.arange(0, dim, 2, dtype=np.float64)[None, :]
    angle = pos / np.power(10000.0, two_i / dim)
    table = np.zeros((n_positions, dim), dtype=np.float64)
    table[:, 0::2] = np.sin(angle)
    table[:, 1::2] = np.cos(angle)[:, : dim // 2]
    return table


def normalize(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(x̂, rstd) over the last axis: x̂ = (x − mean) · rstd, rstd = 1/sqrt(var + ε)."""
    mean = jnp.mean(x, axis=-1, keepdims=True)
    centred = x - mean
    var = jnp.mean(jnp.square(centred), axis=-1, keepdims=True)
    rstd = jax.lax.rsqrt(var + LN_EPSILON)
    return centred * rstd, rstd


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array) -> jax.Array:
    """LayerNorm over the last axis of ``x``; ``scale``/``bias`` are reshaped to that width."""
    normed, _ = normalize(x)
    return normed * scale.reshape(-1) + bias.reshape(-1)


def dropout(x: jax.Array, rate: float, rng: jax.Array | None, train: bool) -> jax.Array:
    """Inverted dropout; identity when not training or when ``rate`` is 0."""
    if not train or rate == 0.0:
        return x
    if rng is None:
        raise ValueError("dropout in train mode needs an rng key")
    return apply_keep_mask(x, keep_mask(rng, x.shape, rate), rate)


def keep_mask(rng: jax.Array, shape: tuple[int, ...], rate: float) -> jax.Array:
    """The bool keep mask of :func:`dropout` for an input of ``shape``."""
    # 16 random bits per element instead of bernoulli's float draw: about 3x cheaper on CPU. The keep
    # probability is threshold / 2**16 (within 1e-5 of 1 - rate) and the scale matches it exactly.
    return jax.random.bits(rng, shape, jnp.uint16) < _keep_threshold(rate)


def apply_keep_mask(x: jax.Array, keep: jax.Array, rate: float) -> jax.Array:
    """x where kept, scaled so the expectation is unchanged; 0 elsewhere."""
    return jnp.where(keep, x * (2**16 / _keep_threshold(rate)), jnp.zeros_like(x))


def _keep_threshold(rate: float) -> int:
    return max(1, min(int(round((1.0 - rate) * 2**16)), 2**16 - 1))


def init_layer_norm(shape: tuple[int, ...], dtype) -> dict:
    return {"scale": jnp.ones(shape, dtype), "bias": jnp.zeros(shape, dtype)}


def uniform_fan_in(key: jax.Array, shape: tuple[int, ...], fan_in: int, dtype) -> jax.Array:
    """U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (SPEC §5)."""
    bound = 1.0 / np.sqrt(fan_in)
    return jax.random.uniform(key, shape, dtype, minval=-bound, maxval=bound)


def init_mlp(key: jax.Array, width: int, dtype) -> dict:
    """GELU MLP D → 4D → D with biases (weights U(±1/sqrt(fan_in)), biases 0)."""
    k1, k2 = jax.random.split(key)
    hidden = 4 * width
    return {
        "w1": uniform_fan_in(k1, (width, hidden), width, dtype),
        "b1": jnp.zeros((hidden,), dtype),
        "w2": uniform_fan_in(k2, (hidden, width), hidden, dtype),
        "b2": jnp.zeros((width,), dtype),
    }


def apply_mlp(params: dict, x: jax.Array) -> jax.Array:
    """W2 · GELU(W1 · x + b1) + b2 over the last axis (exact erf GELU). x (..., D) → (..., D).

    The rows are flattened to one (rows, D) matrix: with the leading axes kept apart XLA:CPU formed
    transposes for the weight gradients (measured 1.16× slower backward at the small size)."""
    rows = x.reshape(-1, x.shape[-1])
    h = gelu(rows @ params["w1"] + params["b1"])
    return (h @ params["w2"] + params["b2"]).reshape(x.shape[:-1] + (-1,))


@jax.custom_jvp
def gelu(x: jax.Array) -> jax.Array:
    """Exact (erf) GELU, x·Φ(x), with its derivative Φ(x) + x·φ(x) written out: autodiff of
    ``jax.nn.gelu`` differentiates through erf's own expansion (more ops in the backward)."""
    return jax.nn.gelu(x, approximate=False)


@gelu.defjvp
def _gelu_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    cdf = 0.5 * (1.0 + jax.lax.erf(x * np.sqrt(0.5).astype(x.dtype)))
    pdf = jnp.exp(-0.5 * jnp.square(x)) * np.sqrt(0.5 / np.pi).astype(x.dtype)
    return jax.nn.gelu(x, approximate=False), dx * (cdf + x * pdf)
