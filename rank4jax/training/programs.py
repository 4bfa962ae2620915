"""The jitted programs of a training run, built once per process and reused by later runs.

A run's programs (the sharded state init, the train step, the eval step) depend only on the model
family and its config, the optimiser settings, the mesh and the batches the step is given (batch
size and layout); the seed, the data and the workdir are run-time inputs. ``run_programs`` builds
them once per such key (a small LRU): a later run with the same key in the same process (a second
run in a notebook, a rerun that resumes, a sweep over seeds or data, the test suite's many tiny
runs) calls the same ``jax.jit`` objects, so JAX finds their traces, lowerings and executables in its in-memory
caches instead of tracing, lowering and compiling again.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import ml_collections

from rank4jax.models.family import ModelFamily
from rank4jax.training import sharding
from rank4jax.training.state import TrainState, create_train_state, make_optimizer
from rank4jax.training.steps import jit_eval_step, jit_train_step


@dataclasses.dataclass(frozen=True)
class RunPrograms:
    optimizer: object  # optax.GradientTransformation of the run's optim settings
    init_fn: functools.partial  # key → TrainState (pure; for eval_shape)
    abstract: TrainState  # the state's shapes and dtypes
    state_sharding: TrainState  # a NamedSharding per leaf
    init: object  # jitted init_fn, creating the state directly sharded
    train_step: object  # jitted (state, batch) → (state, metrics), traced at most max_traces times
    eval_step: object  # jitted (params, batch) → loss sums


def optim_key(optim: ml_collections.ConfigDict) -> tuple:
    """The optimiser settings as a hashable key."""
    return tuple(sorted(optim.to_dict().items()))


class Batches(NamedTuple):
    """What decides the batch shapes a train step meets: runs that share a step draw them from one set
    of at most ``max_shapes``, so the step's trace limit holds for all of them together."""

    batch_size: int
    layout: str  # full, trimmed or compact
    compact_buckets: int
    trim_multiple: int
    max_shapes: int


def batches_key(config: ml_collections.ConfigDict, layout) -> Batches:
    buckets, trim = config.get("compact_buckets", 0), config.get("trim_padding_multiple", 0)
    return Batches(config.batch_size, layout.name, buckets, trim, layout.max_shapes)


@functools.lru_cache(maxsize=8)
def run_programs(family: ModelFamily, model_cfg, optim: tuple, mesh: jax.sharding.Mesh, batches: Batches):
    """``optim``: ``optim_key(config.optim)``; ``batches``: ``batches_key(config, layout)``."""
    optimizer = make_optimizer(ml_collections.ConfigDict(dict(optim)))
    init_fn = functools.partial(create_train_state, family=family, model_cfg=model_cfg, optimizer=optimizer)
    abstract = jax.eval_shape(init_fn, jax.random.key(0))  # the key's value never changes a shape
    state_sharding = sharding.state_shardings(mesh, abstract)
    replicated, batch_sharding = sharding.replicated(mesh), sharding.batch_sharding(mesh)
    return RunPrograms(
        optimizer=optimizer,
        init_fn=init_fn,
        abstract=abstract,
        state_sharding=state_sharding,
        init=jax.jit(init_fn, out_shardings=state_sharding),
        train_step=jit_train_step(
            family, model_cfg, optimizer, state_sharding, batch_sharding, replicated, max_traces=batches.max_shapes
        ),
        eval_step=jit_eval_step(family, model_cfg, state_sharding.params, batch_sharding, replicated),
    )
