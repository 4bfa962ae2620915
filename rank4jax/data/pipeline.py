"""grain input pipelines over in-memory windows.

Training: seeded shuffle (reshuffled every epoch), repeat, batch with drop_remainder, each JAX
process keeping its share of every global batch, then the step's layout mapped over the batches;
the iterator's ``get_state()`` is saved with each checkpoint (a JSON item) and ``set_state`` restores it.
Evaluation: one ordered pass, last partial batch kept, with a (B,) validity mask for padding rows.
"""

from __future__ import annotations

from collections.abc import Callable

import grain
import numpy as np

from rank4jax.errors import DataError

PREFETCH_BATCHES = 4


def _local_rows(process_index: int, process_count: int) -> Callable[[np.ndarray], np.ndarray]:
    """global batch (B, ...) → this process's contiguous share of its rows."""

    def take(batch: np.ndarray) -> np.ndarray:
        local = len(batch) // process_count
        return batch[process_index * local : (process_index + 1) * local]

    return take


def train_dataset(
    windows: np.ndarray,
    batch_size: int,
    seed: int,
    num_epochs: int | None = None,
    process_index: int = 0,
    process_count: int = 1,
    batch_map: Callable[[np.ndarray], object] | None = None,
) -> grain.IterDataset:
    """This process's rows of each global batch of ``batch_size`` windows, as numpy int32
    (B / process_count, T+1, N), or what ``batch_map`` makes of them (the step's layout: a trimmed
    or compact batch, built here by grain rather than in the training loop). ``num_epochs=None``
    repeats forever.

    The order is that of one global stream (shuffle, repeat, batch) whatever the process count:
    every process draws the same global batch and keeps its contiguous share, so a run on 2
    processes sees exactly the batches of a 1-process run, and every process's iterator state is
    the same. The windows are in host memory, so drawing the whole batch costs little."""
    if batch_size % process_count:
        raise DataError(f"batch_size {batch_size} is not divisible by the {process_count} JAX processes")
    ds = grain.MapDataset.source(windows)
    if len(ds) < batch_size:
        raise DataError(f"the training split has {len(ds)} windows, fewer than one batch of {batch_size}")
    ds = ds.shuffle(seed=seed).repeat(num_epochs)
    ds = ds.batch(batch_size, drop_remainder=True, batch_fn=np.stack)
    if process_count > 1:
        ds = ds.map(_local_rows(process_index, process_count))
    if batch_map is not None:
        ds = ds.map(batch_map)
    # one background thread a few batches ahead: the windows are in memory (grain's default, 16
    # threads and 500 elements, is tuned for remote reads and contends for the GIL)
    return ds.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=PREFETCH_BATCHES))


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
