"""Semantic-simulation language model: token states move like damped particles in a
learned potential, one integration step per layer.

Axes: B batch, S stream slots, d = dx·dt width, V vocabulary, M = K_ξ context channels, L layers.

    h₀ = LayerNorm(E[x] + P)   (no affine, ε 1e-5; P the fixed sinusoid), v₀ = 0
    ξ⁽ᵐ⁾_t = Σ_{s≤t} α_m^{t−s} h_s / Σ_{s≤t} α_m^{t−s}   from stop-gradient(h)  (causal EMAs)
    m_t = softplus(b + a·s(x_t)) + 1e-3,   s(v) = −ln((c_v + 1)/(N + V)) the add-one unigram surprisal
    per layer g:  f = −∇_h V_θ,g(ξ, h);  v ← (v + dt·f/m)/(1 + dt·γ);  h ← LayerNorm(h + dt·v)
    logits = h_L · Eᵀ   (tied)

The stop-gradient on h inside ξ is what keeps the model causal when the force comes from autodiff:
without it, ∇_h Σ_t V(ξ_t(h_{≤t}), h_t) at slot s collects terms from every later t through ξ.

Parameters:
    embed (V, d) ~ N(0, 1/d) [choice: unit-scale tied logits]
    mass: {a_raw, b} scalars, softplus(a_raw) = 0.1 and softplus(b) = 1 at init
    xi: {alpha_raw (M,)}, α = sigmoid(alpha_raw) starting at cfg.xi_alphas
    potential: the Gaussian banks or the MLP (``rank4jax.models.splm.potential``)
    buffers: {surprisal (V,)}: s(v), set from the training tokens (``set_surprisal``), never trained

Out of scope (see docs/splm.md): the card's V_φ pair forces and the Fock register pool.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np

from rank4jax.models.common import check_params, normalize, sinusoid_table, token_rows, wide_dtype
from rank4jax.models.splm import potential as pot
from rank4jax.models.splm.config import SPLMConfig
from rank4jax.tokens import PAD_ID


def _softplus_inverse(y: float) -> float:
    return float(np.log(np.expm1(y)))


def init_params(key: jax.Array, cfg: SPLMConfig, dtype=jnp.float32) -> dict:
    k_embed, k_pot = jax.random.split(key)
    d = cfg.width
    embed = (jax.random.normal(k_embed, (cfg.vocab_size, d), dtype) / np.sqrt(d)).at[PAD_ID].set(0)
    alphas = np.asarray(cfg.xi_alphas)
    init_pot = pot.init_gaussian if cfg.potential == "gaussian" else pot.init_mlp_potential
    return {
        "embed": embed,
        "mass": {"a_raw": jnp.asarray(_softplus_inverse(0.1), dtype), "b": jnp.asarray(_softplus_inverse(1.0), dtype)},
        "xi": {"alpha_raw": jnp.asarray(np.log(alphas / (1 - alphas)), dtype)},
        "potential": init_pot(k_pot, cfg, dtype),
        "buffers": {"surprisal": jnp.full((cfg.vocab_size,), np.log(cfg.vocab_size), dtype)},  # no counts yet
    }


def unigram_surprisal(token_counts: np.ndarray) -> np.ndarray:
    """s(v) = −ln((c_v + 1)/(N + V)) from counts (V,) of the training tokens."""
    counts = np.asarray(token_counts, np.float64)
    return -np.log((counts + 1.0) / (counts.sum() + counts.size))


def set_surprisal(params: dict, token_counts: np.ndarray) -> dict:
    """A copy of ``params`` whose surprisal buffer comes from ``token_counts`` (V,)."""
    table = unigram_surprisal(token_counts)
    buf = params["buffers"]["surprisal"]
    if table.shape != buf.shape:
        raise ValueError(f"token counts have shape {table.shape}, the vocabulary needs {buf.shape}")
    return {**params, "buffers": {"surprisal": jnp.asarray(table, buf.dtype)}}


def alphas(params: dict) -> jax.Array:
    return jax.nn.sigmoid(params["xi"]["alpha_raw"])


def causal_ema(h: jax.Array, alpha: jax.Array) -> jax.Array:
    """h (B, S, d), α (M,) → ξ (B, S, M, d): normalised causal EMAs by one O(S) scan.

    The numerator follows num_t = α·num_{t−1} + h_t (|α| < 1, so it stays bounded); the
    denominator Σ_{s≤t} α^{t−s} = (1 − α^{t+1})/(1 − α) is exact in closed form."""
    batch, slots, width = h.shape

    def step(num, h_t):
        num = alpha[None, :, None] * num + h_t[:, None, :]
        return num, num

    init = jnp.zeros((batch, alpha.shape[0], width), h.dtype)
    _, nums = jax.lax.scan(step, init, jnp.swapaxes(h, 0, 1))  # (S, B, M, d)
    t = jnp.arange(1, slots + 1, dtype=h.dtype)[:, None]
    den = (1.0 - alpha[None, :] ** t) / (1.0 - alpha[None, :])  # (S, M)
    return jnp.swapaxes(nums / den[:, None, :, None], 0, 1)


def _xi(params: dict, h: jax.Array, cfg: SPLMConfig) -> jax.Array:
    source = jax.lax.stop_gradient(h) if cfg.xi_stop_gradient else h
    return causal_ema(source, alphas(params))


def potential_value(params: dict, h: jax.Array, layer: int, cfg: SPLMConfig) -> jax.Array:
    """V_θ,layer(ξ(h), h) (B, S)."""
    xi = _xi(params, h, cfg)
    if cfg.potential == "gaussian":
        return pot.gaussian_value(params["potential"], xi, h, layer, cfg)
    return pot.mlp_value(params["potential"], xi, h)


def force(params: dict, h: jax.Array, layer: int, cfg: SPLMConfig) -> jax.Array:
    """f = −∇_h V_θ,layer (B, S, d): closed form for the Gaussian, autodiff for the MLP."""
    if cfg.potential == "gaussian":
        return pot.gaussian_force(params["potential"], _xi(params, h, cfg), h, layer, cfg)
    return -jax.grad(lambda hh: jnp.sum(potential_value(params, hh, layer, cfg)))(h)


def mass(params: dict, inputs: jax.Array) -> jax.Array:
    """m_t (B, S) from the frozen surprisal of the input token."""
    surprisal = jax.lax.stop_gradient(params["buffers"]["surprisal"])[inputs]
    a = jax.nn.softplus(params["mass"]["a_raw"])
    return jax.nn.softplus(params["mass"]["b"] + a * surprisal) + 1e-3


def trajectory(params: dict, inputs: jax.Array, cfg: SPLMConfig) -> jax.Array:
    """inputs (B, S) int → final hidden states h_L (B, S, d)."""
    batch, slots = inputs.shape
    chex.assert_rank(inputs, 2)
    table = jnp.asarray(sinusoid_table(slots, cfg.width), params["embed"].dtype)
    h, _ = normalize(token_rows(params["embed"], inputs) + table)
    v = jnp.zeros_like(h)
    m = mass(params, inputs)[..., None]
    for layer in range(cfg.n_layers):
        f = force(params, h, layer, cfg)
        v = (v + cfg.step * f / m) / (1.0 + cfg.step * cfg.damping)
        h, _ = normalize(h + cfg.step * v)
    return h


def forward(params: dict, inputs: jax.Array, cfg: SPLMConfig) -> tuple[jax.Array, jax.Array]:
    """inputs (B, S) → (logits (B, S, V), V_θ at the last layer's state (B, S) for the loss term
    λ_V·mean(V_θ²), with ξ from stop-gradient(h_L) and the last layer's depth code)."""
    check_params(params, "splm", "the SPLM forward")
    h = trajectory(params, inputs, cfg)
    logits = jnp.matmul(h, params["embed"].T, preferred_element_type=wide_dtype(h))
    return logits, potential_value(params, h, cfg.n_layers - 1, cfg)


def count_params(cfg: SPLMConfig) -> int:
    """Trainable parameters from ``jax.eval_shape`` (the surprisal buffer excluded)."""
    shapes = jax.eval_shape(lambda: init_params(jax.random.key(0), cfg))
    shapes.pop("buffers")
    return sum(int(leaf.size) for leaf in jax.tree_util.tree_leaves(shapes))


def count_potential_params(cfg: SPLMConfig) -> int:
    shapes = jax.eval_shape(lambda: init_params(jax.random.key(0), cfg))
    return sum(int(leaf.size) for leaf in jax.tree_util.tree_leaves(shapes["potential"]))
