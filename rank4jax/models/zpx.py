"""ZPX vector-phase geometry and its attention-score terms, shared by every model family.

Axes: B batch, P query positions, K key positions, W encoder input width, C phase channels,
F geometric feature width (2C for the angle term, 5C with the sphere term).

Phase encoder, per position h (W,) and channel c (three affine maps W → C):

    log r = R·tanh(W_r h / R)  (R = 4),   θ = π·tanh(W_θ h),   b = sigmoid(W_b h),   φ = θ + π·b
    (x, y) = e^{log r}·(cos φ, sin φ)
    stereographic projection: (X, Y, Z) = (2x, 2y, x² + y² − 1) / (1 + x² + y²)   (on the unit sphere)
    tensor = [log r, cos φ, sin φ, X, Y, Z, b]   (…, C, 7)

Score terms added to the content score of every head:

    S_ij += λθ·(1/C)·Σ_c cos(φ_ic − φ_jc) + λS·(1/C)·Σ_c ⟨s_ic, s_jc⟩

Both are inner products of per-position features, because cos(φ_i − φ_j) = cos φ_i cos φ_j +
sin φ_i sin φ_j: with f = [cos φ, sin φ, s] (…, F) and the query side scaled by λ/C, the term is one
(P, F) × (F, K) matmul. The (B, P, K, C) tensor the seed materialises is never formed
(``direct_geometric_scores`` builds it, for tests only). Masks are applied by the caller to the total.

Centre-cancellation regulariser: |Σ_i r_i e^{iφ_i}|² = (Σ_i x_i)² + (Σ_i y_i)² per window and channel,
summed over the real (non-PAD) positions, averaged over batch and channels.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import chex
import jax
import jax.numpy as jnp

from rank4jax.errors import ConfigError
from rank4jax.models.common import uniform_fan_in
from rank4jax.models.scores import STANDARD
from rank4jax.models.sizes import section_values

SCORES = ("standard", "zpx_angle", "zpx_angle_sphere")


@dataclasses.dataclass(frozen=True)
class ZPXConfig:
    """The ZPX attention-score variant (the hook of ``rank4jax.models.scores``): a phase encoder per
    layer, named ``zpx`` in the layer's parameters; the angle (+ sphere) term joins every head's
    score; its auxiliary value is the centre-cancellation term, weighted by ``center_weight``."""

    score: str = "zpx_angle"
    channels: int = 8  # C
    lambda_angle: float = 1.0  # λθ
    lambda_sphere: float = 1.0  # λS
    center_weight: float = 0.0  # weight of the centre-cancellation regulariser in the loss
    max_log_radius: float = 4.0  # R

    name = "zpx"  # key of its parameters in each layer (a class attribute, not a field)

    def __post_init__(self):
        if self.score not in SCORES or self.score == "standard":
            raise ConfigError(f"zpx.score must be one of {SCORES[1:]} for a ZPXConfig, got {self.score!r}")
        if isinstance(self.channels, bool) or not isinstance(self.channels, numbers.Integral) or self.channels < 1:
            raise ConfigError(f"zpx.channels must be a positive integer, got {self.channels!r}")
        for name in ("lambda_angle", "lambda_sphere", "center_weight", "max_log_radius"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise ConfigError(f"zpx.{name} must be a finite number, got {value!r}")
            object.__setattr__(self, name, float(value))
        if self.center_weight < 0 or self.max_log_radius <= 0:
            raise ConfigError("zpx.center_weight must be >= 0 and zpx.max_log_radius > 0")
        object.__setattr__(self, "channels", int(self.channels))

    @property
    def uses_sphere(self) -> bool:
        return self.score == "zpx_angle_sphere"

    @property
    def aux_weight(self) -> float:
        return self.center_weight

    @property
    def feature_width(self) -> int:
        """F: 2C for the angle term, 5C with the sphere term."""
        return (5 if self.uses_sphere else 2) * self.channels

    # --- the score-variant hook (rank4jax.models.scores) ---

    def init_layer(self, key: jax.Array, width: int, dtype) -> dict:
        return init_phase_encoder(key, width, self.channels, dtype)

    def export_shapes(self, width: int) -> dict[str, tuple[int, ...]]:
        c = self.channels
        return {f"zpx.{kind}_{n}": (width, c) if kind == "w" else (c,) for n in ("r", "theta", "b") for kind in "wb"}

    def scores(self, params: dict, u: jax.Array, key_mask: jax.Array) -> tuple[jax.Array, jax.Array]:
        """u (B, P, D) → (the score term (B, P, K), the centre-cancellation value over the real keys)."""
        phase = encode_phase(params, u, self.max_log_radius)
        return geometric_scores(*geometric_features(phase, self)), center_cancellation(phase, key_mask)

    def init_cache(self, batch: int, slots: int, dtype) -> dict:
        """Key features g (B, S, F) and the running sums Σ x, Σ y (B, C) over the real slots."""
        zeros = jnp.zeros((batch, self.channels), dtype)
        return {"g": jnp.zeros((batch, slots, self.feature_width), dtype), "sx": zeros, "sy": zeros}

    def cached_scores(self, params: dict, u, cache: dict, start, real) -> tuple[jax.Array, dict]:
        """u (B, Q, D) at slots [start, start+Q), real (B, Q) → (score term (B, Q, S), cache entries)."""
        phase = encode_phase(params, u, self.max_log_radius)
        query_features, key_features = geometric_features(phase, self)
        g = jax.lax.dynamic_update_slice_in_dim(cache["g"], key_features, start, axis=1)
        w = real.astype(u.dtype)[..., None]
        sums = {
            "sx": cache["sx"] + jnp.sum(phase["x"] * w, axis=1),
            "sy": cache["sy"] + jnp.sum(phase["y"] * w, axis=1),
        }
        return geometric_scores(query_features, g), {"g": g} | sums

    def cached_aux(self, caches: list) -> jax.Array:
        """Mean over layers, batch and channels of |Σ_i r_i e^{iφ_i}|² from the running sums."""
        return jnp.mean(jnp.stack([jnp.mean(c["sx"] ** 2 + c["sy"] ** 2) for c in caches]))


def zpx_config(section):
    """The score variant of a run config's ``model.zpx`` section (a mapping; missing keys take
    defaults): ``scores.STANDARD`` for score "standard", else a ZPXConfig."""
    values = section_values(section, {f.name for f in dataclasses.fields(ZPXConfig)}, "model.zpx")
    if values.get("score", "standard") == "standard":
        if values.get("center_weight"):
            raise ConfigError("zpx.center_weight needs a ZPX score (zpx_angle or zpx_angle_sphere)")
        ZPXConfig(**(values | {"score": "zpx_angle"}))  # the other values are still checked
        return STANDARD
    return ZPXConfig(**values)


def init_phase_encoder(key: jax.Array, width: int, channels: int, dtype=jnp.float32) -> dict:
    """W_r, W_θ, W_b (W, C) ~ U(±1/sqrt(W)) and zero biases (C,)."""
    keys = jax.random.split(key, 3)
    params = {}
    for name, k in zip(("r", "theta", "b"), keys, strict=True):
        params[f"w_{name}"] = uniform_fan_in(k, (width, channels), width, dtype)
        params[f"b_{name}"] = jnp.zeros((channels,), dtype)
    return params


def stereographic(x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The complex plane z = x + iy onto the unit (Riemann) sphere; X² + Y² + Z² = 1."""
    rho2 = x * x + y * y
    den = 1.0 + rho2
    return 2.0 * x / den, 2.0 * y / den, (rho2 - 1.0) / den


def encode_phase(params: dict, h: jax.Array, max_log_radius: float = 4.0) -> dict:
    """h (…, W) → log_r, theta, b, phase, r, x, y (…, C); sphere (…, C, 3); tensor (…, C, 7)."""

    def affine(name):
        return jnp.einsum("...w,wc->...c", h, params[f"w_{name}"]) + params[f"b_{name}"]

    log_r = max_log_radius * jnp.tanh(affine("r") / max_log_radius)
    theta = jnp.pi * jnp.tanh(affine("theta"))
    b = jax.nn.sigmoid(affine("b"))
    phase = theta + jnp.pi * b
    r = jnp.exp(log_r)
    cos, sin = jnp.cos(phase), jnp.sin(phase)
    x, y = r * cos, r * sin
    sx, sy, sz = stereographic(x, y)
    sphere = jnp.stack([sx, sy, sz], axis=-1)
    tensor = jnp.stack([log_r, cos, sin, sx, sy, sz, b], axis=-1)
    return {
        "log_r": log_r,
        "theta": theta,
        "b": b,
        "phase": phase,
        "r": r,
        "x": x,
        "y": y,
        "sphere": sphere,
        "tensor": tensor,
    }


def geometric_features(phase: dict, cfg: ZPXConfig) -> tuple[jax.Array, jax.Array]:
    """(query features scaled by λ/C, key features), each (…, F): their inner product is the
    angle (+ sphere) score term."""
    cos, sin = jnp.cos(phase["phase"]), jnp.sin(phase["phase"])
    keys = [cos, sin]
    scales = [cfg.lambda_angle / cfg.channels] * 2
    if cfg.uses_sphere:
        keys.append(phase["sphere"].reshape(phase["sphere"].shape[:-2] + (-1,)))
        scales.append(cfg.lambda_sphere / cfg.channels)
    queries = [k * s for k, s in zip(keys, scales, strict=True)]
    return jnp.concatenate(queries, axis=-1), jnp.concatenate(keys, axis=-1)


def geometric_scores(query_features: jax.Array, key_features: jax.Array) -> jax.Array:
    """(B, P, F) · (B, K, F) → (B, P, K): one batched matmul."""
    chex.assert_equal_shape_prefix((query_features, key_features), 1)
    return jnp.einsum("bpf,bkf->bpk", query_features, key_features)


def direct_geometric_scores(phase_q: dict, phase_k: dict, cfg: ZPXConfig) -> jax.Array:
    """The seed's direct formula through the (B, P, K, C) tensor. For tests only."""
    diff = phase_q["phase"][:, :, None, :] - phase_k["phase"][:, None, :, :]
    score = cfg.lambda_angle * jnp.mean(jnp.cos(diff), axis=-1)
    if cfg.uses_sphere:
        dots = jnp.sum(phase_q["sphere"][:, :, None] * phase_k["sphere"][:, None, :], axis=-1)
        score = score + cfg.lambda_sphere * jnp.mean(dots, axis=-1)
    return score


def center_cancellation(phase: dict, valid: jax.Array) -> jax.Array:
    """mean over batch and channels of |Σ_i r_i e^{iφ_i}|², the sum over positions where ``valid``.

    phase x, y (B, P, C); valid (B, P) bool."""
    w = valid.astype(phase["x"].dtype)[..., None]
    sx = jnp.sum(phase["x"] * w, axis=1)
    sy = jnp.sum(phase["y"] * w, axis=1)
    return jnp.mean(sx * sx + sy * sy)
