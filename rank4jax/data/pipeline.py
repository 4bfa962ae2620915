"""grain input pipelines over in-memory windows.

Training: seeded shuffle (reshuffled every epoch), repeat, batch with drop_remainder, sharded by JAX
process; the iterator's state can be saved (orbax via ``grain.checkpoint``) and restored.
Evaluation: one ordered pass, last partial batch kept, with a (B,) validity mask for padding rows.
"""

from __future__ import annotations

import grain
import numpy as np

from rank4jax.errors import DataError


def _process_shard(ds: grain.MapDataset, process_index: int, process_count: int) -> grain.MapDataset:
    return ds[process_index::process_count] if process_count > 1 else ds


def train_dataset(
    windows: np.ndarray,
    batch_size: int,
    seed: int,
    num_epochs: int | None = None,
    process_index: int = 0,
    process_count: int = 1,
) -> grain.IterDataset:
    """Batches of ``batch_size // process_count`` windows for this process, as numpy int32
    (B_local, T+1, N). ``num_epochs=None`` repeats forever."""
    if batch_size % process_count:
        raise DataError(f"batch_size {batch_size} is not divisible by the {process_count} JAX processes")
    local_batch = batch_size // process_count
    ds = grain.MapDataset.source(windows)
    ds = _process_shard(ds, process_index, process_count)
    if len(ds) < local_batch:
        raise DataError(
            f"the training split has {len(ds)} windows for this process, fewer than one batch of {local_batch}"
        )
    ds = ds.shuffle(seed=seed).repeat(num_epochs)
    ds = ds.batch(local_batch, drop_remainder=True, batch_fn=np.stack)
    return ds.to_iter_dataset()


def eval_batches(arrays: dict[str, np.ndarray], batch_size: int):
    """Ordered batches over every row once; the last batch is padded with zeros (PAD) up to
    ``batch_size`` and carries ``mask`` (B,) marking the real rows, so shapes stay static."""
    n = len(next(iter(arrays.values())))
    for start in range(0, n, batch_size):
        stop = min(start + batch_size, n)
        batch = {}
        for name, array in arrays.items():
            chunk = array[start:stop]
            if stop - start < batch_size:
                pad = np.zeros((batch_size - (stop - start),) + array.shape[1:], array.dtype)
                chunk = np.concatenate([chunk, pad])
            batch[name] = chunk
        batch["mask"] = np.arange(batch_size) < stop - start
        yield batch
