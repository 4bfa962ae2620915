"""The paper's hand-derived backward pass of a rank-4 attention sublayer (SPEC §6) as custom VJPs:
the heads (:func:`heads`) and LN_attn (:func:`layer_norm`), which ``block.sublayer("analytic")``
hands the layer in place of autodiff's.

Axes as in :mod:`rank4jax.models.rank4.attention`: B batch, H heads, P query positions (x, t), K key
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

Masked keys get the finite minimum score, a constant: they receive no score gradient, and A is 0 there
(all of a query's A when it has no key), so ∂L/∂S is multiplied by the mask.

The forward passes are the autodiff path's own functions, so forward values are identical.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rank4jax.models import common
from rank4jax.models.rank4.attention import joint_heads


@jax.custom_vjp
def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array) -> jax.Array:
    """``common.layer_norm`` (x (..., D), scale and bias of D entries in any shape) with §6's backward."""
    return common.layer_norm(x, scale, bias)


def _norm_fwd(x, scale, bias):
    x_hat, rstd = common.normalize(x)  # the statistics common.layer_norm takes
    return common.layer_norm(x, scale, bias), (x_hat, rstd, scale)


def _norm_bwd(residuals, d_u):
    x_hat, rstd, scale = residuals
    leading = tuple(range(d_u.ndim - 1))
    d_scale = jnp.sum(d_u * x_hat, axis=leading).reshape(scale.shape)
    d_bias = jnp.sum(d_u, axis=leading).reshape(scale.shape)
    g_hat = d_u * scale.reshape(-1)
    d_x = rstd * (
        g_hat - jnp.mean(g_hat, axis=-1, keepdims=True) - x_hat * jnp.mean(g_hat * x_hat, axis=-1, keepdims=True)
    )
    return d_x.astype(x_hat.dtype), d_scale, d_bias  # rstd is float32 or wider; x may be bfloat16


layer_norm.defvjp(_norm_fwd, _norm_bwd)


@jax.custom_vjp
def heads(attn: dict, u: jax.Array, mask: jax.Array) -> jax.Array:
    """Σ_h O_h of ``attention.joint_heads`` (u (B, P, D), its mask) with §6's backward."""
    return joint_heads(attn, u, mask)[0]


def _heads_fwd(attn, u, mask):
    out, tensors = joint_heads(attn, u, mask)
    return out, (attn, u, mask, tensors["q"], tensors["k"], tensors["v"], tensors["weights"])  # (B, H, P, ·)


def _heads_bwd(residuals, g):
    attn, u, mask, q, k, v, a = residuals
    scale = 1.0 / jnp.sqrt(jnp.asarray(q.shape[-1], q.dtype))
    d_v = jnp.einsum("bhpk,bpe->bhke", a, g)
    d_a = jnp.einsum("bpe,bhke->bhpk", g, v)
    d_s = a * (d_a - jnp.sum(a * d_a, axis=-1, keepdims=True))
    d_s = jnp.where(_pairwise(mask), d_s, jnp.zeros_like(d_s))
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
    return d_attn, d_u, None


heads.defvjp(_heads_fwd, _heads_bwd)


def _pairwise(mask: jax.Array) -> jax.Array:
    """A mask of the heads ((B, K), (B, P, K) or (B, H, P, K)) broadcastable to A (B, H, P, K)."""
    return mask.reshape(mask.shape[:1] + (1,) * (4 - mask.ndim) + mask.shape[1:])


def attend(layer: dict, u: jax.Array, mask: jax.Array, extra: jax.Array | None = None):
    """:func:`heads` as a layer's sublayer receives them: Σ_h O_h (B, P, D), a zero auxiliary value and
    no weights (the paper's score only: no ``extra``)."""
    if extra is not None:
        raise ValueError("the analytic (§6) backward covers the paper's score only: no extra score term")
    return heads(layer["attn"], u, mask), jnp.zeros((), u.dtype), None


def attention_block(x: jax.Array, ln: dict, attn: dict, mask: jax.Array) -> jax.Array:
    """Σ_h Attention_h(LN_attn(x)) with the §6 backward: x (B, P, D) → (B, P, D), what SPEC §6 derives."""
    return heads(attn, layer_norm(x, ln["scale"], ln["bias"]), mask)
