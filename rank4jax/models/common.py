"""Building blocks shared by every model family: sinusoid tables, LayerNorm, dropout, GELU MLP,
the one masked softmax.

All functions are pure and follow the dtype of their inputs/parameters (the compute dtype: a run
in bfloat16 hands the model bfloat16 parameters, ``rank4jax.models.precision``), except where
precision matters most: the softmax's max and sum, LayerNorm's statistics and the readout's logits
are taken in at least float32 (:func:`at_least_f32`; float64 stays float64).

Axes: D model width (a flattened fiber), F = 4·D MLP hidden width.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from rank4jax.errors import ConfigError

LN_EPSILON = 1e-5  # SPEC §3 [choice]


def params_family(params) -> str:
    """Which family's parameter tree this is, from its layout: "rank4" (embed a dict of token
    tables), "splm" (a potential), "baseline" (a token table array: the baseline and baseline_lm),
    or "unknown"."""
    if not isinstance(params, dict):
        return "unknown"
    if "potential" in params:
        return "splm"
    if isinstance(params.get("embed"), dict):  # the rank-4 token code's tables (and readout, if any)
        return "rank4"
    return "baseline" if hasattr(params.get("embed"), "shape") else "unknown"


def check_params(params, family: str, entry: str) -> None:
    """A ConfigError naming the family when ``params`` are not ``family``'s (e.g. a baseline run's
    parameters handed to ``rank4jax.forward``)."""
    found = params_family(params)
    if found != family:
        what = "not a model's parameter tree" if found == "unknown" else f"a {found} model's parameters"
        raise ConfigError(
            f"{entry} takes a {family} model's parameters; these are {what}. For a run of any family use "
            "run.family's functions or rank4jax.predict_next(run, sentences)"
        )


def count_params(init_fn, cfg) -> int:
    """Parameter count of ``init_fn(key, cfg)`` from ``jax.eval_shape`` (nothing is allocated)."""
    shapes = jax.eval_shape(lambda: init_fn(jax.random.key(0), cfg))
    return sum(int(leaf.size) for leaf in jax.tree_util.tree_leaves(shapes))


def wide_dtype(x: jax.Array):
    """float32 for a narrower ``x`` (bfloat16), else x's dtype: a matmul's ``preferred_element_type``
    for logits, and what :func:`at_least_f32` casts to."""
    return jnp.promote_types(x.dtype, jnp.float32)


def at_least_f32(x: jax.Array) -> jax.Array:
    """``x`` in float32 when its dtype is narrower (bfloat16), else unchanged."""
    return x.astype(wide_dtype(x))


def masked_softmax(scores: jax.Array, mask: jax.Array) -> jax.Array:
    """The joint softmax of every attention in the project, over the last axis (the keys): masked
    keys get the float32 (or wider) minimum score, so they have zero weight unless every key of the
    query is masked (its weights are then uniform, never NaN; the rank-4 heads zero them). ``mask``
    broadcasts to ``scores``. Max and sum are taken in at least float32; the weights come back in the
    scores' dtype."""
    wide = at_least_f32(scores)
    weights = jax.nn.softmax(jnp.where(mask, wide, jnp.finfo(wide.dtype).min), axis=-1)
    return weights.astype(scores.dtype)


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
    """(x̂, rstd) over the last axis: x̂ = (x − mean) · rstd, rstd = 1/sqrt(var + ε). The statistics
    are taken in at least float32; x̂ comes back in x's dtype, rstd stays wide."""
    wide = at_least_f32(x)
    mean = jnp.mean(wide, axis=-1, keepdims=True)
    centred = wide - mean
    var = jnp.mean(jnp.square(centred), axis=-1, keepdims=True)
    rstd = jax.lax.rsqrt(var + LN_EPSILON)
    return (centred * rstd).astype(x.dtype), rstd


def on_rows(fn, x: jax.Array) -> jax.Array:
    """``fn`` of x (..., D) applied to it as one (rows, D) matrix, the result's leading axes restored.

    The one XLA:CPU workaround of the models (``git show 2d3bf6c:docs/performance.md``, its appendix
    "Levers, measured"): with the leading axes kept apart, XLA:CPU formed transposes for weight gradients and
    reduced (1, R, D) rows slowly. On one row axis the compact Story Cloze step went from 126.1 to
    111.8 ms (reductions 24.9 → 7.1 ms a step), the MLP's backward 1.16× faster, and the readout's
    (V, B·P) logit-gradient transpose disappeared. Shapes and values are unchanged on any backend."""
    out = fn(x.reshape(-1, x.shape[-1]))
    return out.reshape(x.shape[:-1] + out.shape[-1:])


def token_rows(table: jax.Array, tokens: jax.Array) -> jax.Array:
    """``table[tokens]`` with every id outside [0, V) read as a row of NaN (a negative id would wrap to
    V − 1, one of V or more be clamped or filled silently): an invalid id makes the outputs NaN."""
    valid = jnp.where(tokens < 0, table.shape[0], tokens)  # a negative id: out of range, not a wrap
    return jnp.take(table, valid, axis=0, mode="fill", fill_value=jnp.nan)


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array) -> jax.Array:
    """LayerNorm over the last axis of ``x``; ``scale``/``bias`` are reshaped to that width."""
    return on_rows(lambda rows: normalize(rows)[0] * scale.reshape(-1) + bias.reshape(-1), x)


def dropout(x: jax.Array, rate: float, rng: jax.Array | None, train: bool) -> jax.Array:
    """Inverted dropout of x (W, ...), one window per leading index; identity when not training or
    when ``rate`` is 0. ``rng``: a key, or one key per window (:func:`window_keys`)."""
    if not train or rate == 0.0:
        return x
    if rng is None:
        raise ValueError("dropout in train mode needs an rng key")
    return apply_keep_mask(x, keep_mask(window_keys(rng, x.shape[0]), x.shape, rate), rate)


def window_keys(rng: jax.Array | None, n_windows: int) -> jax.Array | None:
    """One dropout key per window, fold_in(rng, w) for w < ``n_windows``; a (W,) key array (keys
    already per window) passes through. Every family draws a window's dropout from its own key, so
    a window gets the same masks whichever batch or microbatch it is in (gradient accumulation)."""
    if rng is None or rng.ndim == 1:
        return rng
    return jax.vmap(jax.random.fold_in, (None, 0))(rng, jnp.arange(n_windows))


def fold_in_keys(keys: jax.Array | None, data: int) -> jax.Array | None:
    """fold_in of each window's key (a layer's or a decode step's keys)."""
    return None if keys is None else jax.vmap(jax.random.fold_in, (0, None))(keys, data)


def split_keys(keys: jax.Array | None) -> tuple:
    """Each window's key split in two: two (W,) key arrays (two Nones for None)."""
    if keys is None:
        return None, None
    first, second = jnp.swapaxes(jax.vmap(jax.random.split)(keys), 0, 1)
    return first, second


def keep_mask(keys: jax.Array, shape: tuple[int, ...], rate: float) -> jax.Array:
    """The bool keep mask of :func:`dropout` for an input of ``shape`` (W, ...), window w's part
    drawn from ``keys[w]``."""
    # 16 random bits per element instead of bernoulli's float draw, the keep probability threshold /
    # 2**16 (within 1e-5 of 1 - rate; the scale matches it exactly). Drawn with jax's original threefry
    # layout: each 64-bit hash gives four elements, where the partitionable layout (the default) spends
    # one hash per element. A window's mask is one key's draw, so there is nothing to partition.
    # Measured (`git show 2d3bf6c:docs/performance.md`, appendix): the dropout bits' op time 9.0 → 2.4 ms a step.
    with jax.threefry_partitionable(False):
        bits = jax.vmap(lambda key: jax.random.bits(key, shape[1:], jnp.uint16))(keys)
    return bits < _keep_threshold(rate)


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


def fan_in_uniform(key: jax.Array, shape: tuple[int, ...], dtype=jnp.float32) -> jax.Array:
    """SPEC §5's weight initialiser as a flax initialiser ``init(key, shape, dtype)``: U(±1/sqrt(fan_in))
    with fan_in = shape[-2], the input width of a (..., fan_in, fan_out) map."""
    return uniform_fan_in(key, shape, shape[-2], dtype)


def init_mlp(key: jax.Array, width: int, dtype, kernel_init=fan_in_uniform) -> dict:
    """GELU MLP D → 4D → D with biases (weights ``kernel_init``, SPEC's U(±1/sqrt(fan_in)); biases 0)."""
    k1, k2 = jax.random.split(key)
    hidden = 4 * width
    return {
        "w1": kernel_init(k1, (width, hidden), dtype),
        "b1": jnp.zeros((hidden,), dtype),
        "w2": kernel_init(k2, (hidden, width), dtype),
        "b2": jnp.zeros((width,), dtype),
    }


def apply_mlp(params: dict, x: jax.Array) -> jax.Array:
    """W2 · GELU(W1 · x + b1) + b2 over the last axis (exact erf GELU). x (..., D) → (..., D)."""

    def mlp(rows):  # (R, D) → (R, 4D) → (R, D); the second matmul sums over the hidden width, which a mesh may split
        hidden = gelu(rows @ params["w1"] + params["b1"])
        return jnp.matmul(hidden, params["w2"], out_sharding=explicit_sharding(rows)) + params["b2"]

    return on_rows(mlp, x)


def explicit_mesh() -> bool:
    """Whether the current mesh (``jax.set_mesh``) has Explicit axes, where every array's sharding is
    part of its type: a contraction over a split axis must then name its output's sharding."""
    mesh = jax.sharding.get_abstract_mesh()
    return not mesh.empty and mesh.are_all_axes_explicit


def explicit_sharding(x: jax.Array):
    """``x``'s sharding on a mesh with Explicit axes (the output sharding of a contraction that should
    be laid out as ``x`` is), else None (XLA's partitioner chooses)."""
    return jax.typeof(x).sharding if explicit_mesh() else None


@jax.custom_jvp
def gelu(x: jax.Array) -> jax.Array:
    """Exact (erf) GELU, x·Φ(x), with its derivative Φ(x) + x·φ(x) written out: autodiff of
    ``jax.nn.gelu`` differentiates through erf's own expansion, more ops and more saved residuals.
    Measured on XLA:CPU (`git show 2d3bf6c:docs/performance.md`; the train step with this against jax's derivative,
    compiled apart and timed interleaved, medians of 7 × 10 steps): 2.6 % faster at the small and
    medium bench sizes (small 98.7 against 101.4 ms, medium 274.8 against 282.0 on the peer's
    windows; level on small Story Cloze batches) and 8–11 % less compiled memory (small 116.5
    against 129.5 MiB, medium 323.9 against 349.9)."""
    return jax.nn.gelu(x, approximate=False)


@gelu.defjvp
def _gelu_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    cdf = 0.5 * (1.0 + jax.lax.erf(x * np.sqrt(0.5).astype(x.dtype)))
    pdf = jnp.exp(-0.5 * jnp.square(x)) * np.sqrt(0.5 / np.pi).astype(x.dtype)
    return jax.nn.gelu(x, approximate=False), dx * (cdf + x * pdf)
