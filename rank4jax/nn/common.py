"""What every ``rank4jax.nn`` module shares: parameters with their logical axis names as flax metadata,
the compute dtype, the dropout keys of a module's ``rngs`` stream, and the checks of its inputs.

Axes: B batch, a grid of any shape (the stories' (N, T)), P = K its cells flattened in C order,
dx/dt fibers, D = dx·dt.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.linen import get_logical_axis_rules

from rank4jax.models import common
from rank4jax.models.partition import DEFAULT_RULES, logical_axes, resolve


def param(value, parent: str, name: str, owner: str) -> nnx.Param:
    """``value`` as an ``nnx.Param`` carrying its logical axis names (``partition.LOGICAL_AXES``: e.g.
    ("heads", "embed", "kv") for WQ) as ``out_sharding``. The names resolve by the user's
    ``nnx.logical_axis_rules`` where those name them, else by ``partition.DEFAULT_RULES`` (the
    trainer's: heads and the MLP width on ``model``), kept as the parameter's own ``sharding_rules``.
    Built under a mesh (``jax.set_mesh``) the value is sharded at once; a name that resolves to an
    axis the mesh lacks is refused, naming the rule to pass. A ``value`` made by
    ``kernel_init=nnx.with_partitioning(init, names)`` keeps the user's names instead."""
    if isinstance(value, nnx.VariableMetadata):  # the user's own annotation
        spec, shape = value.metadata.get("out_sharding") or (), value.raw_value.shape
        if len(spec) != len(shape):
            raise ValueError(
                f"{owner}.{name}: kernel_init's partitioning {tuple(spec)} names {len(spec)} axes for a parameter of "
                f"shape {shape}; a Rank4Block's maps are (H, D, D) and (D, 4D): pass a plain initializer and map "
                "the logical axes ('heads', 'mlp', ...) with nnx.logical_axis_rules, or partition each submodule"
            )
        return nnx.Param(value)
    names = logical_axes(parent, name, value.ndim)
    if names is None:
        return nnx.Param(value)
    context = dict(get_logical_axis_rules())
    own = tuple((alias, axis) for alias, axis in DEFAULT_RULES if alias in names and alias not in context)
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty:
        check_on_mesh(resolve(names, tuple(context.items()) + own), mesh, names, f"{owner}.{name}")
    return nnx.Param(value, out_sharding=names, sharding_rules=own, eager_sharding=not mesh.empty)


def check_on_mesh(spec, mesh, names: tuple, what: str) -> None:
    """A ValueError naming the rule to pass when ``spec`` (resolved from ``names``) uses an axis the mesh lacks."""
    for name, axes in zip(names, spec, strict=True):
        for axis in axes if isinstance(axes, tuple) else (axes,):
            if axis is not None and axis not in mesh.axis_names:
                raise ValueError(
                    f"{what}: logical axis {name!r} maps to mesh axis {axis!r}, which the mesh {mesh.axis_names} "
                    f"lacks; build it under nnx.logical_axis_rules([({name!r}, <a mesh axis or None>), ...])"
                )


def initial(params, rngs, init):
    """The given parameters, else ``init(key)`` with a key from ``rngs.params()``."""
    if params is not None:
        return params
    return init(params_key(rngs))


def params_key(rngs) -> jax.Array:
    """The next key of ``rngs``'s params stream, or one ValueError saying what to pass."""
    if not isinstance(rngs, nnx.Rngs):
        raise ValueError("pass rngs=nnx.Rngs(seed) to initialise the module, or build it with from_params")
    return rngs.params()


def dropout_stream(rngs) -> nnx.RngStream | None:
    """The module's own dropout stream, forked from ``rngs`` as ``nnx.Dropout`` forks it: its ``dropout``
    stream, else its ``default`` one; None without either."""
    if isinstance(rngs, nnx.RngStream):
        return rngs.fork()
    if isinstance(rngs, nnx.Rngs):
        for name in ("dropout", "default"):
            if name in rngs:
                return rngs[name].fork()
    return None


def dropout_keys(batch: int, rngs, stream: nnx.RngStream | None, owner: str) -> jax.Array:
    """One dropout key per window (B,): from the call's ``rngs`` (an ``nnx.Rngs``, a stream, a key —
    typed or a legacy uint32 ``PRNGKey`` — or one key per window), else the module's own ``stream``."""
    source = rngs if rngs is not None else stream
    if source is None:
        raise ValueError(
            f"{owner} in training mode with dropout > 0 needs a dropout stream: build it with "
            "rngs=nnx.Rngs(params=0, dropout=1), pass rngs= at the call, or call .eval()"
        )
    if isinstance(source, nnx.Rngs):
        if "dropout" not in source and "default" not in source:
            raise ValueError(f"{owner}: the rngs given have no dropout stream: pass nnx.Rngs(dropout=1) (or a key)")
        source = source["dropout"] if "dropout" in source else source["default"]
    key = source() if isinstance(source, nnx.RngStream) else jnp.asarray(source)
    if not jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        if key.dtype != jnp.uint32 or key.shape[-1:] != (2,):
            raise ValueError(
                f"{owner}: rngs must be an nnx.Rngs, an RngStream or a PRNG key, got {key.dtype} {key.shape}"
            )
        key = jax.random.wrap_key_data(key)  # a legacy jax.random.PRNGKey
    if key.ndim not in (0, 1) or (key.ndim == 1 and key.shape[0] != batch):
        raise ValueError(f"{owner}: rngs must be one key or one per window ({batch},), got keys of shape {key.shape}")
    return common.window_keys(key, batch)


def compute_dtype(dtype, *arrays):
    """The dtype a module computes in: its ``dtype``, else the promotion of its floating inputs and
    parameters (flax's rule: a float32 module given bfloat16 input computes in float32)."""
    if dtype is not None:
        return jnp.dtype(dtype)
    return jnp.result_type(*(a for a in arrays if jnp.issubdtype(a.dtype, jnp.floating)))


def cast(tree, dtype):
    """Every floating leaf of ``tree`` in ``dtype`` (the trainer's ``precision.cast_to_compute``)."""
    return jax.tree.map(lambda a: a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a, tree)


def check_stream(x, fiber: tuple[int, int], owner: str, name: str = "x") -> None:
    """``x`` must be a floating (B, *grid, dx, dt) array with at least one grid axis."""
    dx, dt = fiber
    shape = getattr(x, "shape", None)
    if shape is None or len(shape) < 4:
        raise ValueError(
            f"{owner}: {name} must be (B, *grid, dx, dt) = (B, ..., {dx}, {dt}) with at least one grid axis, "
            f"got shape {shape}"
        )
    if tuple(shape[-2:]) != (dx, dt):
        raise ValueError(
            f"{owner}: {name}'s fibers must be (dx, dt) = ({dx}, {dt}), got {tuple(shape[-2:])} of {shape}"
        )
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"{owner}: {name} must be floating, got {x.dtype}")
    if shape[0] == 0:
        raise ValueError(f"{owner}: {name} holds no windows (B = 0, shape {shape})")


def check_extra(extra, x_shape: tuple, owner: str):
    """``extra``: an additive score term (B or 1, P, K) over the grid's cells (C order), or None."""
    if extra is None:
        return None
    cells = int(np.prod(x_shape[1:-2]))
    extra = jnp.asarray(extra)
    if extra.ndim != 3 or extra.shape[1:] != (cells, cells) or extra.shape[0] not in (1, x_shape[0]):
        raise ValueError(
            f"{owner}: extra must be a score term (B, P, K) = ({x_shape[0]}, {cells}, {cells}) over the grid's "
            f"cells, got shape {extra.shape}"
        )
    return extra
