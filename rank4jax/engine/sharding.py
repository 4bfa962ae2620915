"""Device mesh and shardings (jax.sharding; one jitted program, no pmap).

The mesh has two named axes:

- ``data``: the batch is split along it; parameters are replicated across it;
- ``model``: the attention heads (H axis of WQ/WK/WV) and the MLP hidden width (4D) are split
  along it. Rank-4 heads are summed, so head parallelism costs one reduction per layer (and one
  for the MLP's second matmul); XLA's partitioner inserts them.

Parameters and optimiser moments get their PartitionSpec from their names (``attn.wq`` …,
``mlp.w1`` …; ``rank4jax.models.partition``), so the AdamW moments, which mirror the parameter tree,
shard like the parameters.
Batches are assembled from each process's local rows with ``jax.make_array_from_process_local_data``.
"""

from __future__ import annotations

import hashlib
import os

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from rank4jax.errors import ConfigError
from rank4jax.models.partition import MODEL_AXIS, leaf_partition

DATA_AXIS = "data"


def mesh_shape(data: int, model: int, n_devices: int | None = None) -> tuple[int, int]:
    """Resolve ``data=-1`` (every device not used by ``model``) and check the shape fits."""
    n_devices = jax.device_count() if n_devices is None else n_devices
    for name, value in (("mesh.data", data), ("mesh.model", model)):
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or (value <= 0 and not (name == "mesh.data" and value == -1))
        ):
            raise ConfigError(f"{name} must be a positive integer (mesh.data may be -1 for 'all'), got {value!r}")
    if data == -1:
        if n_devices % model:
            raise ConfigError(f"mesh.model={model} does not divide the {n_devices} available devices")
        data = n_devices // model
    if data * model > n_devices:
        raise ConfigError(f"mesh data={data} x model={model} needs {data * model} devices; only {n_devices} available")
    return data, model


def make_mesh(data: int = -1, model: int = 1) -> jax.sharding.Mesh:
    """A (data, model) mesh over the first data·model devices."""
    data, model = mesh_shape(data, model)
    devices = jax.devices()[: data * model]
    return jax.make_mesh((data, model), (DATA_AXIS, MODEL_AXIS), axis_types=(AxisType.Auto,) * 2, devices=devices)


def check_divisibility(
    mesh: jax.sharding.Mesh, *, batch_sizes: dict[str, int], n_heads: int | None, hidden: int | None
):
    data, model = mesh.shape[DATA_AXIS], mesh.shape[MODEL_AXIS]
    for name, size in batch_sizes.items():
        if size % data:
            raise ConfigError(f"{name} {size} is not divisible by the data axis ({data} devices)")
    if n_heads is not None and n_heads % model:
        raise ConfigError(f"model.n_heads={n_heads} is not divisible by the model axis (mesh.model={model})")
    if hidden is not None and hidden % model:
        raise ConfigError(f"the MLP width {hidden} is not divisible by the model axis (mesh.model={model})")


def _names(path) -> list:
    return [getattr(k, "key", getattr(k, "name", getattr(k, "idx", None))) for k in path]


def partition_spec(path, leaf) -> PartitionSpec:
    names = _names(path)
    return leaf_partition(*([None] * (2 - len(names)) + names[-2:]), getattr(leaf, "ndim", None))


def state_shardings(mesh: jax.sharding.Mesh, abstract_state):
    """NamedShardings for every leaf of a (abstract) train state: heads / MLP width on ``model``."""
    return jax.tree_util.tree_map_with_path(lambda p, x: NamedSharding(mesh, partition_spec(p, x)), abstract_state)


def with_shardings(abstract, shardings):
    """ShapeDtypeStructs of ``abstract`` carrying ``shardings`` (a restore target)."""
    return jax.tree_util.tree_map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)


def device_memory_bytes(device) -> int | None:
    """What one device can hold: the accelerator's memory limit, or the host's physical memory for
    a CPU device (None when unknown)."""
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 -- not offered by this backend / device
        stats = None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    return host_memory_bytes()


def host_memory_bytes() -> int | None:
    """This machine's physical memory (None when unknown)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def refuse_beyond_device_memory(needed: int, what: str, remedy: str, detail: str = " per device") -> None:
    """A ConfigError, ``<what> need <X> GiB<detail>, more than the <Y> GiB a <platform> device has here;
    <remedy>``, when ``needed`` bytes exceed what one of this process's devices holds (another
    process's devices report nothing)."""
    device = jax.local_devices()[0]
    limit = device_memory_bytes(device)
    if limit and needed > limit:
        raise ConfigError(
            f"{what} need {needed / 2**30:,.1f} GiB{detail}, more than the {limit / 2**30:,.1f} GiB a "
            f"{device.platform} device has here; {remedy}"
        )


def check_state_fits(abstract_state, shardings, n_params: int) -> None:
    """Refuse, before anything is allocated, a train state whose per-device share (parameters and
    AdamW moments, plus the gradients: the parameters' size again) exceeds a device's memory;
    otherwise such a model ends in a long swap or an allocation failure far into the run."""

    def device_bytes(leaf, sharding):
        return int(np.prod(sharding.shard_shape(leaf.shape))) * np.dtype(leaf.dtype).itemsize

    state = sum(map(device_bytes, jax.tree_util.tree_leaves(abstract_state), jax.tree_util.tree_leaves(shardings)))
    params = sum(
        map(device_bytes, jax.tree_util.tree_leaves(abstract_state.params), jax.tree_util.tree_leaves(shardings.params))
    )
    refuse_beyond_device_memory(
        state + params,
        f"the model has {n_params:,} parameters: its parameters, AdamW moments and gradients",
        "make the model smaller (model.dx, dt, n_layers) or shard it (mesh.model)",
    )


def check_window_fits(n_tokens: int, n_slices: int, vocab_size: int) -> None:
    """Refuse a window whose logits alone (N × T positions × V tokens in float32) exceed a device's
    memory: no batch size helps, so the error names ``model.n_tokens``."""
    positions = n_tokens * n_slices
    refuse_beyond_device_memory(
        positions * vocab_size * 4,
        f"model.n_tokens={n_tokens:,}: one window's logits",
        "lower model.n_tokens",
        detail=f" ({positions:,} positions × {vocab_size:,} tokens, float32)",
    )
    refuse_beyond_device_memory(
        positions * positions * 4,
        f"model.n_tokens={n_tokens:,}: one window's attention weights of a head",
        "lower model.n_tokens",
        detail=f" ({positions:,} × {positions:,} positions, float32)",
    )


def check_batches_fit(config, vocab_size: int, data_devices: int, names=("batch_size", "eval_batch_size")) -> None:
    """Refuse, before anything is allocated, a batch size whose logits alone (B × N × T positions ×
    V tokens in float32, the largest tensor a step makes) exceed a device's share of memory; otherwise
    an evaluation batch of 10⁸ windows trained for a whole interval and then failed allocating."""
    check_window_fits(config.model.n_tokens, config.model.n_slices, vocab_size)
    positions = config.model.n_tokens * config.model.n_slices
    for name in names:
        refuse_beyond_device_memory(
            -(-config[name] // data_devices) * positions * vocab_size * 4,
            f"{name}={config[name]:,}: one batch's logits ({positions:,} positions × {vocab_size:,} tokens a "
            "window, float32)",
            f"lower {name}",
        )


def replicated(mesh: jax.sharding.Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: jax.sharding.Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def put_batch(local_rows, sharding: NamedSharding):
    """This process's rows (an array, or a dict of arrays with the same leading axis, such as a
    compact batch) → global arrays sharded along the data axis."""
    return jax.tree.map(lambda rows: jax.make_array_from_process_local_data(sharding, rows), local_rows)


def replica_digest(tree) -> str:
    """sha256 (16 hex digits) of this process's own copy of every fully replicated leaf (leaves
    split along the model axis hold different shards on different processes and are left out):
    equal across processes iff the replicas agree."""
    h = hashlib.sha256()
    for leaf in jax.tree_util.tree_leaves(tree):
        if not leaf.sharding.is_fully_replicated:
            continue
        h.update(np.ascontiguousarray(np.asarray(leaf.addressable_data(0))).tobytes())
    return h.hexdigest()[:16]


def check_replicas_agree(tree) -> str:
    """Every process's replica digest of ``tree`` (a multi-process run's parameters) must equal
    process 0's; raises with both digests otherwise. Returns this process's digest."""
    digest = replica_digest(tree)
    mine = np.frombuffer(bytes.fromhex(digest), np.uint8)
    multihost_utils.assert_equal(mine, f"process {jax.process_index()}'s parameters differ from process 0's")
    return digest
