"""The paper's hand-derived backward pass of one rank-4 attention block (SPEC §6) as a custom VJP.

The block is LN_attn followed by H-head rank-4 attention: X (B, P, D) → Σ_h O_h (B, P, D). Axes as
in :mod:`rank4jax.models.rank4.attention`: B batch, H heads, P query positions (x, t), K key
positions (x', t') of the joint grid, D = dx·dt, s = 1/sqrt(D). With G = ∂L/∂O (the same for every
head, because head outputs are summed):

    ∂L/∂V_h[k]    = Σ_p A_h[p, k] G[p]
    ∂L/∂A_h[p, k] = <G[p], V_h[k]>
    ∂L/∂S_h[p, ·] = A_h[p, ·] ⊙ (∂L/∂A_h[p, ·] − Σ_k A_h[p, k] ∂L/∂A_h[p, k])   (joint-softmax row Jacobian)
    ∂L/∂Q_h[p]    = s Σ_k ∂L/∂S_h[p, k] K_h[k]
    ∂L/∂K_h[k]    = s Σ_p ∂L/∂S_h[p, k] Q_h[p]
    ∂L/∂W·_h      = Σ_{b,p} U[b, p] ⊗ ∂L/∂·_h[b, p]                           (outer products over positions)
    ∂L/∂U         = Σ_h ∂L/∂Q_h WQ_hᵀ + ∂L/∂K_h WK_hᵀ + ∂L/∂V_h WV_hᵀ
    then through LayerNorm: U = x̂ ⊙ γ + β, x̂ = (X − μ)·rstd:
    ∂L/∂γ = Σ ∂L/∂U ⊙ x̂,  ∂L/∂β = Σ ∂L/∂U,
    ∂L/∂X = rstd · (ĝ − mean(ĝ) − x̂ · mean(ĝ ⊙ x̂)),  ĝ = ∂L/∂U ⊙ γ.

Masked keys get the finite minimum score, a constant: they receive no score gradient. Their A is 0
unless every key of the query is masked (then A is uniform), so ∂L/∂S is multiplied by the key mask.

The forward pass runs the same functions as the autodiff path, so forward values are identical.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rank4jax.models.common import normalize
from rank4jax.models.rank4.attention import attention_heads


def _forward(x, ln, attn, key_mask):
    x_hat, rstd = normalize(x)
    gamma = ln["scale"].reshape(-1)
    u = x_hat * gamma + ln["bias"].reshape(-1)
    out, heads = attention_heads(attn, u, key_mask)  # the autodiff path's own forward
    return out, (x_hat, rstd, u, heads["q"], heads["k"], heads["v"], heads["weights"])  # (B, H, P, ·)


@jax.custom_vjp
def attention_block(x: jax.Array, ln: dict, attn: dict, key_mask: jax.Array) -> jax.Array:
    """Σ_h Attention_h(LN_attn(x)) with the §6 backward. x (B, P, D); key_mask (B, K) bool."""
    return _forward(x, ln, attn, key_mask)[0]


def _fwd(x, ln, attn, key_mask):
    out, saved = _forward(x, ln, attn, key_mask)
    return out, (saved, ln, attn, key_mask)


def _bwd(residuals, g):
    (x_hat, rstd, u, q, k, v, a), ln, attn, key_mask = residuals
    scale = 1.0 / jnp.sqrt(jnp.asarray(q.shape[-1], q.dtype))
    d_v = jnp.einsum("bhpk,bpe->bhke", a, g)
    d_a = jnp.einsum("bpe,bhke->bhpk", g, v)
    d_s = a * (d_a - jnp.sum(a * d_a, axis=-1, keepdims=True))
    d_s = jnp.where(key_mask[:, None, None, :], d_s, jnp.zeros_like(d_s))
    d_q = jnp.einsum("bhpk,bhke->bhpe", d_s, k) * scale
    d_k = jnp.einsum("bhpk,bhpe->bhke", d_s, q) * scale
    d_attn = {
        "wq": jnp.einsum("bpd,bhpe->hde", u, d_q),
        "wk": jnp.einsum("bpd,bhpe->hde", u, d_k),
        "wv": jnp.einsum("bpd,bhpe->hde", u, d_v),
    }
    d_u = (
        jnp.einsum("bhpe,hde->bpd", d_q, attn["wq"])
        + jnp.einsum("bhpe,hde->bpd", d_k, attn["wk"])
        + jnp.einsum("bhpe,hde->bpd", d_v, attn["wv"])
    )
    fiber_shape = ln["scale"].shape
    d_ln = {
        "scale": jnp.sum(d_u * x_hat, axis=(0, 1)).reshape(fiber_shape),
        "bias": jnp.sum(d_u, axis=(0, 1)).reshape(fiber_shape),
    }
    g_hat = d_u * ln["scale"].reshape(-1)
    d_x = rstd * (
        g_hat - jnp.mean(g_hat, axis=-1, keepdims=True) - x_hat * jnp.mean(g_hat * x_hat, axis=-1, keepdims=True)
    )
    return d_x.astype(x_hat.dtype), d_ln, d_attn, None  # rstd is float32 or wider; x may be bfloat16


attention_block.defvjp(_fwd, _bwd)
