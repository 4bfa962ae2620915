"""The learned potentials V_θ of the SPLM and their forces f = −∇_h V_θ.

Axes: B batch, S stream slots, d hidden width, M = K_ξ context channels (one Gaussian bank each),
K wells per bank, L layers, F MLP hidden width; n chunks of c positions (the Gaussian's evaluation).

Depth-conditioned multi-context Gaussian (bank m at layer g reads z = ξ⁽ᵐ⁾ + e_g⁽ᵐ⁾):

    μ_k(z) = W_μ z + b_μ                         (M, d) → (M, K, d)
    a_k(z) = min(softplus(W_a z + b_a) + 1e-4, 2/d)   precisions, b_a starts at −ln d
    w(z)   = softmax_k(W_w z + b_w)
    g_k    = exp(−½ Σ_i a_k,i (h_i − μ_k,i)²)
    V_m    = −Σ_k w_k g_k ∈ [−1, 0],   V_θ = Σ_m V_m ∈ [−M, 0]
    f      = −∇_h V_θ = −Σ_m Σ_k w_k g_k a_k ⊙ (h − μ_k)        (closed form, no autodiff)

The Gaussian is evaluated in chunks of about ``CHUNK_POSITIONS`` (batch, slot) positions (a
``lax.map``), so its (M, c, K, d) centre and precision tensors stay small enough for the CPU's cache;
the force has a hand-written backward pass that recomputes each chunk's terms instead of storing
them. Formed for all B·S positions at once, as first written, the Gaussian step took 3.5–4.9× the
MLP potential's (docs/splm.md; ``tests/fixtures/splm_gaussian_reference.npz`` holds that version's
float64 values, forces and gradients, which this one reproduces).

MLP: V_θ = MLP([ξ⁽¹⁾ … ξ⁽ᴹ⁾; h]) (Linear → GELU, ``mlp_depth`` linear layers, scalar output), one
network shared by all layers; its force is −jax.grad of Σ_positions V_θ with respect to h.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np

from rank4jax.models.common import at_least_f32, uniform_fan_in
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


CHUNK_POSITIONS = 256  # [choice] (batch, slot) positions per chunk of the Gaussian V_θ (bench/bench_splm.py)


def _chunk_terms(p: dict, z: jax.Array, h: jax.Array):
    """One chunk of c positions: z (M, c, d), h (c, d) → the softplus input and output, precisions a,
    h − μ (M, c, K, d), the mixture weights w and the well heights g (M, c, K)."""
    m, c, d = z.shape
    k = p["b_w"].shape[-1]
    mu = (jnp.einsum("mcd,mdj->mcj", z, p["w_mu"]) + p["b_mu"][:, None]).reshape(m, c, k, d)
    a_pre = (jnp.einsum("mcd,mdj->mcj", z, p["w_a"]) + p["b_a"][:, None]).reshape(m, c, k, d)
    soft = jax.nn.softplus(a_pre) + 1e-4
    a = jnp.minimum(soft, 2.0 / d)
    logits = jnp.einsum("mcd,mdk->mck", z, p["w_w"]) + p["b_w"][:, None]
    w = jax.nn.softmax(at_least_f32(logits), axis=-1).astype(logits.dtype)  # max and sum in float32
    diff = h[None, :, None, :] - mu
    g = jnp.exp(-0.5 * jnp.sum(a * diff * diff, axis=-1))
    return a_pre, soft, a, diff, w, g


def _chunk_force(p: dict, z: jax.Array, h: jax.Array) -> jax.Array:
    """f = −Σ_m Σ_k w_k g_k a_k ⊙ (h − μ_k) (c, d) for one chunk."""
    _, _, a, diff, w, g = _chunk_terms(p, z, h)
    return -jnp.einsum("mck,mckd->cd", w * g, a * diff)


def _chunk_force_vjp(p: dict, z: jax.Array, h: jax.Array, f_bar: jax.Array):
    """The cotangents of (p, z, h) for a cotangent f̄ (c, d) of ``_chunk_force``, by hand: the terms
    are recomputed here (nothing (M, c, K, d) is stored between the passes). With u = w·g,
    q = Σ_i a_i (h_i − μ_i)² and g = exp(−q/2):
        ū_k = −f̄·(a_k ⊙ diff_k),  q̄_k = −½ g_k w_k ū_k,  ā_k = −u_k f̄ ⊙ diff_k + q̄_k diff_k²,
        diff̄_k = −u_k a_k ⊙ f̄ + 2 q̄_k a_k ⊙ diff_k,  h̄ = Σ_mk diff̄_k,  μ̄_k = −diff̄_k,
        (W_a z + b_a)̄ = ā ⊙ sigmoid(W_a z + b_a) where the clamp 2/d is not active (0 where it is),
        (W_w z + b_w)̄ = w ⊙ (w̄ − Σ_k w_k w̄_k) with w̄_k = ū_k g_k."""
    m, c, d = z.shape
    a_pre, soft, a, diff, w, g = _chunk_terms(p, z, h)
    ad = a * diff
    u_bar = -jnp.einsum("cd,mckd->mck", f_bar, ad)
    q_bar = -0.5 * g * w * u_bar
    u = (w * g)[..., None]
    fb = f_bar[None, :, None, :]
    a_bar = q_bar[..., None] * diff * diff - u * fb * diff
    diff_bar = 2.0 * q_bar[..., None] * ad - u * a * fb
    mu_bar = -diff_bar.reshape(m, c, -1)
    a_pre_bar = jnp.where(soft < 2.0 / d, a_bar * jax.nn.sigmoid(a_pre), 0.0).reshape(m, c, -1)
    w_bar = u_bar * g
    s_bar = w * (w_bar - jnp.sum(w * w_bar, axis=-1, keepdims=True))
    p_bar = {
        "w_mu": jnp.einsum("mcd,mcj->mdj", z, mu_bar),
        "b_mu": jnp.sum(mu_bar, axis=1),
        "w_a": jnp.einsum("mcd,mcj->mdj", z, a_pre_bar),
        "b_a": jnp.sum(a_pre_bar, axis=1),
        "w_w": jnp.einsum("mcd,mck->mdk", z, s_bar),
        "b_w": jnp.sum(s_bar, axis=1),
    }
    z_bar = (
        jnp.einsum("mcj,mdj->mcd", mu_bar, p["w_mu"])
        + jnp.einsum("mcj,mdj->mcd", a_pre_bar, p["w_a"])
        + jnp.einsum("mck,mdk->mcd", s_bar, p["w_w"])
    )
    return p_bar, z_bar, jnp.sum(diff_bar, axis=(0, 2))


@jax.custom_vjp
def _chunked_force(p: dict, z: jax.Array, h: jax.Array) -> jax.Array:
    """z (n, M, c, d), h (n, c, d) → f (n, c, d), one chunk at a time."""
    return jax.lax.map(lambda zh: _chunk_force(p, *zh), (z, h))


def _chunked_force_fwd(p, z, h):
    return _chunked_force(p, z, h), (p, z, h)


def _chunked_force_bwd(res, f_bar):
    p, z, h = res

    def chunk(acc, zhf):
        p_bar, z_bar, h_bar = _chunk_force_vjp(p, *zhf)
        return jax.tree_util.tree_map(jnp.add, acc, p_bar), (z_bar, h_bar)

    p_bar, (z_bar, h_bar) = jax.lax.scan(chunk, jax.tree_util.tree_map(jnp.zeros_like, p), (z, h, f_bar))
    return p_bar, z_bar, h_bar


_chunked_force.defvjp(_chunked_force_fwd, _chunked_force_bwd)


def _to_chunks(xi: jax.Array, h: jax.Array, depth: jax.Array):
    """xi (B, S, M, d), h (B, S, d) → z = ξ + depth code as (n, M, c, d) and h as (n, c, d): chunks of
    c = B·s positions (s slots of every row, S padded to n·s), so the batch axis is never split."""
    batch, slots, m, d = xi.shape
    s = max(1, CHUNK_POSITIONS // batch)
    n = -(-slots // s)
    pad = ((0, 0), (0, n * s - slots))
    z = jnp.pad(xi + depth, pad + ((0, 0), (0, 0))).reshape(batch, n, s, m, d)
    z = jnp.transpose(z, (1, 3, 0, 2, 4)).reshape(n, m, batch * s, d)
    h = jnp.transpose(jnp.pad(h, pad + ((0, 0),)).reshape(batch, n, s, d), (1, 0, 2, 3)).reshape(n, batch * s, d)
    return z, h, (batch, slots, n, s)


def _from_chunks(x: jax.Array, shape) -> jax.Array:
    """(n, c, ...) per-chunk results → (B, S, ...)."""
    batch, slots, n, s = shape
    x = x.reshape((n, batch, s) + x.shape[2:])
    return jnp.moveaxis(x, 0, 1).reshape((batch, n * s) + x.shape[3:])[:, :slots]


def _banks(p: dict) -> dict:
    return {name: value for name, value in p.items() if name != "depth"}


def gaussian_value(p: dict, xi: jax.Array, h: jax.Array, layer: int, cfg: SPLMConfig) -> jax.Array:
    """V_θ (B, S) ∈ [−M, 0], chunk by chunk (each chunk recomputed in the backward pass)."""
    chex.assert_shape(xi, h.shape[:2] + (cfg.xi_channels, cfg.width))
    z, hc, shape = _to_chunks(xi, h, p["depth"][layer])
    banks = _banks(p)

    @jax.checkpoint
    def chunk(zh):
        _, _, _, _, w, g = _chunk_terms(banks, *zh)
        return -jnp.sum(w * g, axis=(0, 2))

    return _from_chunks(jax.lax.map(chunk, (z, hc)), shape)


def gaussian_force(p: dict, xi: jax.Array, h: jax.Array, layer: int, cfg: SPLMConfig) -> jax.Array:
    """f = −∇_h V_θ (B, S, d) in closed form, chunk by chunk, with a hand-written backward pass."""
    chex.assert_shape(xi, h.shape[:2] + (cfg.xi_channels, cfg.width))
    z, hc, shape = _to_chunks(xi, h, p["depth"][layer])
    return _from_chunks(_chunked_force(_banks(p), z, hc), shape)


def mlp_value(p: dict, xi: jax.Array, h: jax.Array) -> jax.Array:
    """V_θ (B, S) = MLP([ξ⁽¹⁾ … ξ⁽ᴹ⁾; h])."""
    x = jnp.concatenate([xi.reshape(xi.shape[:2] + (-1,)), h], axis=-1)
    layers = p["layers"]
    for layer in layers[:-1]:
        x = jax.nn.gelu(x @ layer["w"] + layer["b"], approximate=False)
    return (x @ layers[-1]["w"] + layers[-1]["b"])[..., 0]
