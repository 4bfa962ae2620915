"""Framework-neutral export of rank-4 parameters as a flat ``dict[str, numpy.ndarray]`` (SPEC §10).

Weight tensors are laid out input fiber first, then output fiber; the attention maps are
(H, dx, dt, dx, dt) = [h, n_in, q_in, n_out, q_out], a pure reshape of the internal (H, D, D)
because φ(n, q) = n·dt + q is C order.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from rank4jax.errors import DataError
from rank4jax.models.rank4.config import Rank4Config


def canonical_shapes(cfg: Rank4Config) -> dict[str, tuple[int, ...]]:
    """Every exported name with its shape, in a stable order."""
    v, dx, dt, h, d = cfg.vocab_size, cfg.dx, cfg.dt, cfg.n_heads, cfg.width
    shapes = cfg.tokens.export_shapes(v, dx, dt)  # the paper's: embed.sem, embed.tmp, readout.tmp
    for layer in range(cfg.n_layers):
        p = f"layers.{layer}."
        shapes |= {
            p + "ln_attn.scale": (dx, dt),
            p + "ln_attn.bias": (dx, dt),
            p + "attn.wq": (h, dx, dt, dx, dt),
            p + "attn.wk": (h, dx, dt, dx, dt),
            p + "attn.wv": (h, dx, dt, dx, dt),
            p + "ln_mlp.scale": (dx, dt),
            p + "ln_mlp.bias": (dx, dt),
            p + "mlp.w1": (d, 4 * d),
            p + "mlp.b1": (4 * d,),
            p + "mlp.w2": (4 * d, d),
            p + "mlp.b2": (d,),
        }
        # a score variant's parameters (beyond SPEC §10), e.g. the ZPX phase encoder: "zpx.w_r", …
        shapes |= {p + name: shape for name, shape in cfg.score.export_shapes(d).items()}
    return shapes | {"final_ln.scale": (dx, dt), "final_ln.bias": (dx, dt)}


def _internal_path(name: str) -> tuple:
    """'layers.1.attn.wq' → ('layers', 1, 'attn', 'wq')."""
    parts = name.split(".")
    return tuple(int(p) if p.isdigit() else p for p in parts)


def _get(tree, path):
    for key in path:
        tree = tree[key]
    return tree


def export_params(params: dict, cfg: Rank4Config) -> dict[str, np.ndarray]:
    """Parameter tree → flat float32 numpy dict with the names and shapes of SPEC §10."""
    flat = {}
    for name, shape in canonical_shapes(cfg).items():
        value = np.asarray(_get(params, _internal_path(name)), dtype=np.float32)
        flat[name] = value.reshape(shape)
    return flat


def import_params(flat: dict, cfg: Rank4Config, dtype=jnp.float32) -> dict:
    """Flat dict (SPEC §10) → parameter tree. Raises DataError naming a missing, unexpected or
    mis-shaped array; nothing is returned unless every array is valid."""
    shapes = canonical_shapes(cfg)
    missing = [n for n in shapes if n not in flat]
    if missing:
        raise DataError(f"parameter import: missing array {missing[0]!r} ({len(missing)} missing in all)")
    unexpected = sorted(set(flat) - set(shapes))
    if unexpected:
        raise DataError(f"parameter import: unexpected array {unexpected[0]!r} for this config")
    for name, shape in shapes.items():
        got = tuple(np.shape(flat[name]))
        if got != shape:
            raise DataError(f"parameter import: array {name!r} has shape {got}, expected {shape}")
        if not np.issubdtype(np.asarray(flat[name]).dtype, np.floating):
            raise DataError(f"parameter import: array {name!r} has non-float dtype {np.asarray(flat[name]).dtype}")

    d = cfg.width
    internal_shape = {"wq": (cfg.n_heads, d, d), "wk": (cfg.n_heads, d, d), "wv": (cfg.n_heads, d, d)}
    params: dict = {"layers": [{} for _ in range(cfg.n_layers)]}
    for name in shapes:
        path = _internal_path(name)
        value = np.asarray(flat[name])
        if path[-1] in internal_shape and path[-2] == "attn":
            value = value.reshape(internal_shape[path[-1]])
        node = params
        for key in path[:-1]:
            if isinstance(node, list):
                node = node[key]
            else:
                node = node.setdefault(key, {})
        node[path[-1]] = jnp.asarray(value, dtype=dtype)
    return params
