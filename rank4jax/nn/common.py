"""What every ``rank4jax.nn`` module shares: parameters with the trainer's partition as flax metadata,
the compute dtype, the dropout keys of a module's ``rngs`` stream, and the checks of its inputs.

Axes: B batch, a grid of any shape (the stories' (N, T)), P = K its cells flattened in C order,
dx/dt fibers, D = dx·dt.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rank4jax.models import common
from rank4jax.models.partition import leaf_partition


def param(value: jax.Array, parent: str, name: str) -> nnx.Param:
    """``value`` as an ``nnx.Param`` carrying the trainer's partition of ``parent.name`` (the model axis
    on the attention heads and the MLP width: ``rank4jax.models.partition``) as ``out_sharding``. Built
    under a mesh (``jax.set_mesh``) with those axes, the value is sharded at once, as the trainer shards
    the same tree; built without one, it stays where it is and only carries the names."""
    spec = leaf_partition(parent, name, value.ndim)
    if not any(spec):
        return nnx.Param(value)
    mesh = jax.sharding.get_abstract_mesh()
    eager = not mesh.empty and all(axis in mesh.axis_names for axis in spec if axis is not None)
    return nnx.Param(value, out_sharding=tuple(spec), eager_sharding=eager)


def initial(params, rngs, init):
    """The given parameters, else ``init(key)`` with a key from ``rngs.params()``."""
    if params is not None:
        return params
    if rngs is None:
        raise ValueError("pass rngs=nnx.Rngs(seed) to initialise the module, or build it with from_params")
    return init(rngs.params())


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


def key_mask(mask, x_shape: tuple, owner: str, is_causal: bool = False, causal_axis: int = -1) -> jax.Array:
    """The keys every query may attend to, for the attention heads: (B or 1, K) bool, or (B or 1, P, K)
    when causal. ``mask`` (None: every cell a key) must broadcast to (B, *grid); ``is_causal``: a query
    sees only the keys at or before its own index along the grid axis ``causal_axis`` (the stories'
    slices: the last axis of their (N, T) grid)."""
    grid_shape = tuple(x_shape[:-2])  # (B, *grid)
    if mask is None:
        keys = jnp.ones((1, int(np.prod(grid_shape[1:]))), bool)
    else:
        mask = jnp.asarray(mask)
        if mask.dtype != jnp.bool_:
            raise ValueError(f"{owner}: mask must be bool (True: the cell is a key), got {mask.dtype}")
        try:
            broadcast = np.broadcast_shapes(mask.shape, grid_shape)
        except ValueError:
            broadcast = None
        if broadcast != grid_shape:
            raise ValueError(f"{owner}: mask of shape {mask.shape} does not broadcast to (B, *grid) = {grid_shape}")
        mask = mask.reshape((1,) * (len(grid_shape) - mask.ndim) + mask.shape)
        batch = grid_shape[0] if mask.shape[0] != 1 else 1
        keys = jnp.broadcast_to(mask, (batch,) + grid_shape[1:]).reshape(batch, -1)
    if not is_causal:
        return keys
    grid = grid_shape[1:]
    axis = causal_axis % len(grid)
    index = np.broadcast_to(np.arange(grid[axis]).reshape([-1 if a == axis else 1 for a in range(len(grid))]), grid)
    index = index.reshape(-1)  # each cell's index along the causal axis (P,)
    return keys[:, None, :] & jnp.asarray(index[None, :] <= index[:, None])[None]  # (B or 1, P, K)


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
