"""The learned potentials V_θ of the SPLM and their forces f = −∇_h V_θ.

Axes: B batch, S stream slots, d hidden width, M = K_ξ context channels (one Gaussian bank each),
K wells per bank, L layers, F MLP hidden width.

Depth-conditioned multi-context Gaussian (bank m at layer g reads z = ξ⁽ᵐ⁾ + e_g⁽ᵐ⁾):

    μ_k(z) = W_μ z + b_μ                         (M, d) → (M, K, d)
    a_k(z) = min(softplus(W_a z + b_a) + 1e-4, 2/d)   precisions, b_a starts at −ln d
    w(z)   = softmax_k(W_w z + b_w)
    g_k    = exp(−½ Σ_i a_k,i (h_i − μ_k,i)²)
    V_m    = −Σ_k w_k g_k ∈ [−1, 0],   V_θ = Σ_m V_m ∈ [−M, 0]
    f      = −∇_h V_θ = −Σ_m Σ_k w_k g_k a_k ⊙ (h − μ_k)        (closed form, no autodiff)

MLP: V_θ = MLP([ξ⁽¹⁾ … ξ⁽ᴹ⁾; h]) (Linear → GELU, ``mlp_depth`` linear layers, scalar output), one
network shared by all layers; its force is −jax.grad of Σ_positions V_θ with respect to h.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np

from rank4jax.models.common import uniform_fan_in
from rank4jax.models.splm.config import SPLMConfig


def init_gaussian(key: jax.Array, cfg: SPLMConfig, dtype=jnp.float32) -> dict:
    """Banks stacked on a leading M axis; depth codes (L, M, d) ~ N(0, 0.02²)."""
    d, m, k = cfg.width, cfg.xi_channels, cfg.wells
    k_mu, k_a, k_w, k_depth = jax.random.split(key, 4)
    return {
        "w_mu": uniform_fan_in(k_mu, (m, d, k * d), d, dtype),
        "b_mu": jnp.zeros((m, k * d), dtype),
        "w_a": uniform_fan_in(k_a, (m, d, k * d), d, dtype),
        "b_a": jnp.full((m, k * d), -np.log(d), dtype),
        "w_w": uniform_fan_in(k_w, (m, d, k), d, dtype),
        "b_w": jnp.zeros((m, k), dtype),
        "depth": 0.02 * jax.random.normal(k_depth, (cfg.n_layers, m, d), dtype),
    }


def init_mlp_potential(key: jax.Array, cfg: SPLMConfig, dtype=jnp.float32) -> dict:
    widths = [(cfg.xi_channels + 1) * cfg.width] + [cfg.mlp_hidden] * (cfg.mlp_depth - 1) + [1]
    keys = jax.random.split(key, cfg.mlp_depth)
    return {
        "layers": [
            {"w": uniform_fan_in(k, (fan_in, fan_out), fan_in, dtype), "b": jnp.zeros((fan_out,), dtype)}
            for k, fan_in, fan_out in zip(keys, widths[:-1], widths[1:], strict=True)
        ]
    }


def _gaussian_terms(p: dict, xi: jax.Array, h: jax.Array, layer: int, cfg: SPLMConfig):
    """xi (B, S, M, d), h (B, S, d) → weights·g (B, S, M, K), precisions a and h − μ (B, S, M, K, d)."""
    d, k = cfg.width, cfg.wells
    chex.assert_shape(xi, h.shape[:2] + (cfg.xi_channels, d))
    z = xi + p["depth"][layer]  # (B, S, M, d)
    mu = (jnp.einsum("bsmd,mdj->bsmj", z, p["w_mu"]) + p["b_mu"]).reshape(z.shape[:3] + (k, d))
    a_pre = (jnp.einsum("bsmd,mdj->bsmj", z, p["w_a"]) + p["b_a"]).reshape(z.shape[:3] + (k, d))
    a = jnp.minimum(jax.nn.softplus(a_pre) + 1e-4, 2.0 / d)
    w = jax.nn.softmax(jnp.einsum("bsmd,mdk->bsmk", z, p["w_w"]) + p["b_w"], axis=-1)
    diff = h[:, :, None, None, :] - mu
    g = jnp.exp(-0.5 * jnp.sum(a * diff * diff, axis=-1))  # (B, S, M, K)
    return w * g, a, diff


def gaussian_value(p: dict, xi: jax.Array, h: jax.Array, layer: int, cfg: SPLMConfig) -> jax.Array:
    """V_θ (B, S) ∈ [−M, 0]."""
    wg, _, _ = _gaussian_terms(p, xi, h, layer, cfg)
    return -jnp.sum(wg, axis=(-2, -1))


def gaussian_force(p: dict, xi: jax.Array, h: jax.Array, layer: int, cfg: SPLMConfig) -> jax.Array:
    """f = −∇_h V_θ (B, S, d) in closed form."""
    wg, a, diff = _gaussian_terms(p, xi, h, layer, cfg)
    return -jnp.einsum("bsmk,bsmkd->bsd", wg, a * diff)


def mlp_value(p: dict, xi: jax.Array, h: jax.Array) -> jax.Array:
    """V_θ (B, S) = MLP([ξ⁽¹⁾ … ξ⁽ᴹ⁾; h])."""
    x = jnp.concatenate([xi.reshape(xi.shape[:2] + (-1,)), h], axis=-1)
    layers = p["layers"]
    for layer in layers[:-1]:
        x = jax.nn.gelu(x @ layer["w"] + layer["b"], approximate=False)
    return (x @ layers[-1]["w"] + layers[-1]["b"])[..., 0]
