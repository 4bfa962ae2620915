"""Device mesh and shardings (jax.sharding; no pmap).

One jitted program over a Mesh: the batch is sharded along the ``data`` axis and the train state is
replicated. Batches are assembled from each process's local rows with
``jax.make_array_from_process_local_data``.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from rank4jax.errors import ConfigError

DATA_AXIS = "data"


def make_mesh(batch_size: int) -> jax.sharding.Mesh:
    """A 1-D data-parallel mesh over every device; the batch must divide evenly."""
    n_devices = jax.device_count()
    if batch_size % n_devices:
        raise ConfigError(f"batch_size {batch_size} is not divisible by the {n_devices} devices of the data axis")
    return jax.make_mesh((n_devices,), (DATA_AXIS,), axis_types=(AxisType.Auto,))


def replicated(mesh: jax.sharding.Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: jax.sharding.Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def put_batch(local_rows: np.ndarray, sharding: NamedSharding) -> jax.Array:
    """This process's rows → one global array sharded along the data axis."""
    return jax.make_array_from_process_local_data(sharding, local_rows)
