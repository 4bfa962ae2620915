"""zpx-verify: the ZPX seed's geometry checks (seed 001 §10), on rank4jax's functions.

    zpx-verify [--dtype float32|float64]        (or: python -m rank4jax.experiments.zpx_verify)

Checks, each with its tolerance (float32; the seed's own figures in brackets):

1. stereographic points have norm 1: max |X² + Y² + Z² − 1| ≤ 1e-6                  [2.98e-7]
2. the angle kernel is invariant to a global phase rotation α = 0.731: ≤ 1e-6       [1.19e-7]
3. a complex rotation by α preserves the radius: max |r² − r′²| / max r² ≤ 1e-6     [1.90e-6 absolute]
4. z(t) = r0·e^{(γ+iω)t}, γ = 0.08, ω = 3: log r is linear in θ, R² ≥ 1 − 1e-6, slope γ/ω ± 1e-5
5. the matmul form of the geometric score equals the direct (B, P, K, C) formula: ≤ 1e-5
6. gradients of a loss (+ centre regulariser) reach every parameter of a ZPX rank-4 model and a ZPX
   baseline, finite and not all zero

Exits 1 if any check fails. B = 2, L = 16, D = 32, C = 8 as in the seed.
"""

from __future__ import annotations

import argparse
import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np

from rank4jax.models import baseline, rank4, zpx

TOLERANCES = {
    "sphere_norm_error": 1e-6,
    "angle_rotation_invariance_error": 1e-6,
    "rotation_radius_relative_error": 1e-6,
    "spiral_r2_shortfall": 1e-6,
    "spiral_slope_error": 1e-5,
    "matmul_vs_direct_score_error": 1e-5,
}


@functools.partial(jax.jit, static_argnums=1)
def _geometry_arrays(key: jax.Array, dtype) -> dict:
    """The arrays checks 1, 2, 3 and 5 measure, as one program (eager, each operation would compile
    its own): the phase encoding of random h, the angle scores before and after a global phase
    rotation, the radii before and after a complex rotation, the matmul and direct scores."""
    batch, length, width, channels = 2, 16, 32, 8
    k_h, k_enc = jax.random.split(key)
    h = jax.random.normal(k_h, (batch, length, width), dtype)
    cfg = zpx.ZPXConfig(score="zpx_angle_sphere", channels=channels)
    phase = zpx.encode_phase(zpx.init_phase_encoder(k_enc, width, channels, dtype), h)
    alpha = jnp.asarray(0.731, dtype)
    angle_only = zpx.ZPXConfig(score="zpx_angle", channels=channels)
    rotated = {**phase, "phase": phase["phase"] + alpha}
    x, y = phase["x"], phase["y"]
    xr = x * jnp.cos(alpha) - y * jnp.sin(alpha)
    yr = x * jnp.sin(alpha) + y * jnp.cos(alpha)
    return {
        "sphere_norm": jnp.sum(phase["sphere"] ** 2, axis=-1),
        "angle_scores": zpx.geometric_scores(*zpx.geometric_features(phase, angle_only)),
        "rotated_angle_scores": zpx.geometric_scores(*zpx.geometric_features(rotated, angle_only)),
        "r2": x * x + y * y,
        "rotated_r2": xr * xr + yr * yr,
        "matmul_scores": zpx.geometric_scores(*zpx.geometric_features(phase, cfg)),
        "direct_scores": zpx.direct_geometric_scores(phase, phase, cfg),
    }


def geometry_checks(dtype=jnp.float32, seed: int = 0) -> dict:
    """The numeric checks 1–5; every value is an error (smaller is better)."""
    a = {k: np.asarray(v) for k, v in _geometry_arrays(jax.random.key(seed), jnp.dtype(dtype)).items()}
    out = {"sphere_norm_error": float(np.max(np.abs(a["sphere_norm"] - 1.0)))}
    out["angle_rotation_invariance_error"] = float(np.max(np.abs(a["angle_scores"] - a["rotated_angle_scores"])))
    out["rotation_radius_relative_error"] = float(np.max(np.abs(a["r2"] - a["rotated_r2"])) / np.max(a["r2"]))

    t = np.linspace(0.0, 20.0, 2048)
    r0, gamma, omega = 1.0, 0.08, 3.0
    log_r, theta = np.log(r0 * np.exp(gamma * t)), omega * t
    (slope, intercept), *_ = np.linalg.lstsq(np.stack([theta, np.ones_like(theta)], 1), log_r, rcond=None)
    fit = slope * theta + intercept
    r_squared = 1.0 - np.sum((log_r - fit) ** 2) / np.sum((log_r - log_r.mean()) ** 2)
    out["spiral_r2_shortfall"] = float(1.0 - r_squared)
    out["spiral_slope_error"] = float(abs(slope - gamma / omega))
    out["matmul_vs_direct_score_error"] = float(np.max(np.abs(a["matmul_scores"] - a["direct_scores"])))
    return out


def gradient_checks(dtype=jnp.float32) -> dict:
    """Per family: the number of parameter leaves and how many got a finite, non-zero gradient."""
    from rank4jax.models.family import BASELINE, RANK4

    z = zpx.ZPXConfig(score="zpx_angle_sphere", channels=8, center_weight=0.01)
    sizes = dict(vocab_size=40, n_tokens=6, n_slices=3, dx=4, dt=4, n_heads=2, n_layers=2, dropout=0.1, score=z)
    rng = np.random.default_rng(0)
    windows = rng.integers(4, 40, size=(2, 4, 6)).astype(np.int32)
    windows[:, :, 4:] = 0
    out = {}
    for family, cfg in ((RANK4, rank4.Rank4Config(**sizes)), (BASELINE, baseline.BaselineConfig(**sizes))):
        params = jax.tree_util.tree_map(lambda a: a.astype(dtype), family.init(jax.random.key(1), cfg))

        def loss(p, family=family, cfg=cfg):
            return family.loss_sums(p, jnp.asarray(windows), cfg, train=True, rng=jax.random.key(2))["objective"]

        grads = [np.asarray(g) for g in jax.tree_util.tree_leaves(jax.jit(jax.grad(loss))(params))]
        ok = [bool(np.all(np.isfinite(g)) and np.any(g != 0)) for g in grads]
        out[family.name] = (sum(ok), len(ok))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="zpx-verify", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    args = ap.parse_args(argv)
    with jax.enable_x64(args.dtype == "float64"):
        dtype = jnp.dtype(args.dtype).type
        failed = []
        for name, value in geometry_checks(dtype).items():
            ok = value <= TOLERANCES[name]
            failed += [] if ok else [name]
            print(f"{name:34s} {value:10.3e}  (tolerance {TOLERANCES[name]:.0e})  {'ok' if ok else 'FAIL'}")
        for family, (good, total) in gradient_checks(dtype).items():
            ok = good == total
            failed += [] if ok else [f"{family}_gradients"]
            print(
                f"{family + ' gradients finite, non-zero':34s} {good:4d} / {total:<4d} leaves  {'ok' if ok else 'FAIL'}"
            )
    print("all ZPX checks passed" if not failed else f"FAILED: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
