"""The jitted programs of a run: every program training and evaluation run is built here.

``train_step(state, batch) -> (state, metrics)`` is pure: dropout keys come from fold_in(rng, step),
one per window (fold_in of the window's index), so a window's masks do not depend on the batch it
is in; the ``StepPolicy`` sets the compute dtype and the gradient accumulation (``gradients``);
the metrics (loss, last-slice sums, the L2 norms of parameters, gradients and updates) stay on the
device (the loop fetches them every ``log_every`` steps, never every step). ``eval_step(params,
batch)`` returns the loss sums; ``predict_and_score`` and ``score`` serve the Story Cloze and
rollout evaluators. Each is jitted with the mesh's shardings (the train state donated).

``build_programs`` builds them once per key (model family and config, optimiser settings, mesh,
batches; a small LRU): the seed, the data and the workdir are run-time inputs, so a later run with
the same key in the same process (a rerun that resumes, a sweep over seeds, the test suite's tiny
runs) calls the same ``jax.jit`` objects and compiles nothing. Training, evaluation, the experiment
reports and the benches all take their programs from here. Outside this module ``jax.jit`` wraps
module-level functions with the parameters as arguments, never closed over: the checkpoint's
finiteness check, the prediction decoder and the experiments' own probes (``zpx_verify`` and
``splm_probe`` jit their per-check losses once per check). The optimiser state rebuilt on a resume
that changed the optimiser is the one jit built where it is used (once per such resume).

``CompiledStep`` compiles the train step ahead of time (``jit(...).lower(...).compile()``) for each
batch shape it meets, keeps each executable's memory analysis, and refuses to compile more shapes
than the batch layout can produce: the one guard against silent recompilation.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import ml_collections
import optax

from rank4jax.engine import sharding
from rank4jax.engine.batches import microbatches, n_windows
from rank4jax.engine.state import TrainState, create_train_state, learning_rate_schedule, make_optimizer
from rank4jax.models.common import window_keys
from rank4jax.models.family import ModelFamily
from rank4jax.models.precision import cast_to_compute


@dataclasses.dataclass(frozen=True)
class StepPolicy:
    """How a step computes: the compute dtype (``rank4jax.models.precision``) and the number of
    microbatches a train step's batch is split into (gradient accumulation)."""

    compute_dtype: str = "float32"
    grad_accum_steps: int = 1

    @classmethod
    def of(cls, config: ml_collections.ConfigDict) -> StepPolicy:
        return cls(config.compute_dtype, config.grad_accum_steps)


def train_step(
    state: TrainState, batch, *, family: ModelFamily, model_cfg, optimizer, schedule, policy: StepPolicy, groups: int
):
    keys = window_keys(state.dropout_key(), n_windows(batch))  # a window's dropout, whichever microbatch
    loss, sums, grads = gradients(state.params, batch, keys, family, model_cfg, policy, groups)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {
        "loss": loss,
        "grad_norm": optax.tree.norm(grads),
        "param_norm": optax.tree.norm(params),
        "update_norm": optax.tree.norm(updates),
        "last_slice_ce_sum": sums["last_slice_ce_sum"],
        "last_slice_tokens": sums["last_slice_tokens"],
        "learning_rate": schedule(state.step),  # the rate of this step's update
    }
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def gradients(params, batch, keys, family: ModelFamily, model_cfg, policy: StepPolicy, groups: int):
    """(objective, loss sums, gradient) of a training batch, in ``policy``'s compute dtype.

    With ``grad_accum_steps`` = k > 1 the batch is split into k microbatches (``batches.microbatches``:
    each device keeps its own windows) and a ``lax.scan`` adds their gradients, so only one
    microbatch's activations are alive at a time. The selection CE is a mean over the batch's
    tokens, so each microbatch's objective is weighted by its token count and the sum divided by the
    batch's: the same update as the whole batch (a family's auxiliary term is then token-weighted
    over the microbatches; the paper's model and the baseline have none)."""

    def objective(p, micro, micro_keys):
        sums = family.loss_sums(cast_to_compute(p, policy.compute_dtype), micro, model_cfg, train=True, rng=micro_keys)
        return sums["objective"], sums

    k = policy.grad_accum_steps
    if k == 1:
        (loss, sums), grads = jax.value_and_grad(objective, has_aux=True)(params, batch, keys)
        return loss, sums, grads

    def weighted(p, micro, micro_keys):
        loss, sums = objective(p, micro, micro_keys)
        return loss * jax.lax.stop_gradient(sums["window_tokens"]), sums

    def terms(p, micro):
        (value, sums), grads = jax.value_and_grad(weighted, has_aux=True)(p, *micro)
        return value, sums, grads

    def add(total, micro):
        return jax.tree.map(jnp.add, total, terms(params, micro)), None

    micro = _split(batch, keys, k, groups)
    shapes = jax.eval_shape(terms, params, jax.tree.map(lambda x: x[0], micro))
    zeros = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes)
    (value, sums, grads), _ = jax.lax.scan(add, zeros, micro)
    tokens = jnp.maximum(sums["window_tokens"], 1)
    loss = value / tokens
    return loss, sums | {"objective": loss}, jax.tree.map(lambda g: g / tokens, grads)


def _split(batch, keys, k: int, groups: int):
    """(microbatches, their keys), each stacked on a leading axis of ``k``."""
    lead = jax.tree.leaves(batch)[0].shape[0]  # B windows, or G groups of W windows (a compact batch)
    micro_batches, micro_keys = microbatches((batch, keys.reshape(lead, -1)), k, groups)
    return micro_batches, micro_keys.reshape(k, -1)


def microbatch_step(state: TrainState, batch, *, family: ModelFamily, model_cfg, policy: StepPolicy, groups: int):
    """The gradient of the first of a train batch's ``grad_accum_steps`` microbatches, the body the
    accumulation's ``lax.scan`` runs k times: compiled only for its FLOP count (XLA's cost analysis
    counts a scan's body once, ``CompiledStep``)."""
    keys = window_keys(state.dropout_key(), n_windows(batch))
    micro_batches, micro_keys = _split(batch, keys, policy.grad_accum_steps, groups)
    first = jax.tree.map(lambda x: x[0], (micro_batches, micro_keys))
    return gradients(state.params, *first, family, model_cfg, dataclasses.replace(policy, grad_accum_steps=1), groups)


def eval_step(params, batch, *, family: ModelFamily, model_cfg) -> dict:
    sums = family.loss_sums(params, batch, model_cfg, train=False)
    sums.pop("objective")
    return sums


def _cast_first(fn, compute_dtype: str):
    """``fn(params, ...)`` with the parameters in the compute dtype, under ``fn``'s own name (the
    name a profile and JAX's compile log show)."""

    def cast_first(params, *args):
        return fn(cast_to_compute(params, compute_dtype), *args)

    cast_first.__name__ = getattr(fn, "func", fn).__name__  # through functools.partial
    return cast_first


def optim_key(optim: ml_collections.ConfigDict, num_steps: int = 0) -> tuple:
    """The optimiser settings as a hashable key, with the run's ``num_steps`` where the schedule
    decays over them (0 otherwise: a constant rate's programs serve any run length)."""
    steps = num_steps if optim.schedule != "constant" else 0
    return tuple(sorted(optim.to_dict().items())) + (("num_steps", steps),)


@dataclasses.dataclass(frozen=True)
class Programs:
    mesh: jax.sharding.Mesh
    optimizer: optax.GradientTransformation
    abstract: TrainState  # the state's shapes and dtypes
    state_sharding: TrainState  # a NamedSharding per leaf
    batch_sharding: jax.sharding.NamedSharding
    init: object  # key → TrainState, created directly sharded
    train_step: object  # (state, batch) → (state, metrics)
    microbatch_step: object | None  # (state, batch) → one microbatch's gradient (None: no accumulation)
    eval_step: object  # (params, batch) → loss sums
    predict_and_score: object  # (params, windows) → (Ŝ(T) (B, N), mean CE of S(T) (B,))
    score: object  # (params, windows) → mean CE of S(T) (B,)
    policy: StepPolicy = StepPolicy()


@functools.lru_cache(maxsize=8)
def build_programs(
    family: ModelFamily, model_cfg, optim: tuple, mesh: jax.sharding.Mesh, policy: StepPolicy = StepPolicy()
) -> Programs:
    """``optim``: ``optim_key(config.optim, config.num_steps)``; ``policy``: ``StepPolicy.of(config)``."""
    settings = dict(optim)
    num_steps = settings.pop("num_steps")
    optim_settings = ml_collections.ConfigDict(settings)
    optimizer = make_optimizer(optim_settings, num_steps)
    init_fn = functools.partial(create_train_state, family=family, model_cfg=model_cfg, optimizer=optimizer)
    abstract = jax.eval_shape(init_fn, jax.random.key(0))  # the key's value never changes a shape
    state_sharding = sharding.state_shardings(mesh, abstract)
    replicated, batch_sharding = sharding.replicated(mesh), sharding.batch_sharding(mesh)
    on_batches = dict(in_shardings=(state_sharding.params, batch_sharding), out_shardings=replicated)
    dtype = policy.compute_dtype
    on_model = dict(family=family, model_cfg=model_cfg, policy=policy, groups=mesh.shape[sharding.DATA_AXIS])
    return Programs(
        mesh=mesh,
        optimizer=optimizer,
        abstract=abstract,
        state_sharding=state_sharding,
        batch_sharding=batch_sharding,
        init=jax.jit(init_fn, out_shardings=state_sharding),
        train_step=jax.jit(
            functools.partial(
                train_step,
                family=family,
                model_cfg=model_cfg,
                optimizer=optimizer,
                schedule=learning_rate_schedule(optim_settings, num_steps),
                policy=policy,
                groups=mesh.shape[sharding.DATA_AXIS],
            ),
            in_shardings=(state_sharding, batch_sharding),
            out_shardings=(state_sharding, replicated),
            donate_argnums=0,
        ),
        microbatch_step=(
            jax.jit(functools.partial(microbatch_step, **on_model), in_shardings=(state_sharding, batch_sharding))
            if policy.grad_accum_steps > 1
            else None
        ),
        eval_step=jax.jit(
            _cast_first(functools.partial(eval_step, family=family, model_cfg=model_cfg), dtype), **on_batches
        ),
        predict_and_score=jax.jit(
            _cast_first(functools.partial(family.predict_and_score, cfg=model_cfg), dtype), **on_batches
        ),
        score=jax.jit(_cast_first(functools.partial(family.last_slice_ce, cfg=model_cfg), dtype), **on_batches),
        policy=policy,
    )


MEMORY_FIELDS = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes")


def memory_analysis(compiled) -> dict[str, int] | None:
    """The compiled executable's memory figures (bytes), or None where the backend gives none."""
    stats = compiled.memory_analysis()
    if stats is None:
        return None
    return {name.removesuffix("_size_in_bytes") + "_bytes": int(getattr(stats, name)) for name in MEMORY_FIELDS}


def _signature(tree) -> tuple:
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return (treedef, tuple((tuple(x.shape), str(x.dtype)) for x in leaves))


class CompiledStep:
    """A jitted step, compiled ahead of time once per batch shape (at most ``max_shapes``).

    ``flops_done`` counts the FLOPs of every step run, by XLA's cost analysis of each executable: the
    forward, the backward and the optimiser's update (AdamW's elementwise arithmetic, once a step).
    XLA counts a ``lax.scan``'s body once, so with gradient accumulation (``repeated`` = (k, the
    body's program): one microbatch's gradient) the body's count is added k − 1 more times.

    ``step(*args)`` runs the executable compiled for the shapes of ``args``; ``compile(*args)``
    compiles (or finds) it without running. ``memory`` maps each compiled shape to its memory
    analysis; ``peak_memory`` is the largest argument + output + temp − alias figure among them.
    """

    def __init__(self, jitted, max_shapes: int, name: str = "train step", repeated=None):
        self.jitted, self.max_shapes, self.name = jitted, max_shapes, name
        self.repeated = repeated  # (k, a program of the body a scan runs k times), or None
        self._executables: dict[tuple, object] = {}
        self.memory: dict[tuple, dict | None] = {}
        self._flops: dict[tuple, float] = {}  # XLA's cost analysis of each executable (NaN: none)
        self.flops_done = 0.0  # the FLOPs of every step run so far, by XLA's count (host-side: no sync)

    def compile(self, *args):
        return self._compiled(_signature(args[-1]), args)  # the batch; the state's shapes are fixed for a run

    def _compiled(self, key, args):
        executable = self._executables.get(key)
        if executable is None:
            if len(self._executables) >= self.max_shapes:
                raise RuntimeError(  # a bug, not user input
                    f"the {self.name} would compile for a batch shape beyond the {self.max_shapes} this "
                    f"batch layout can produce: {key[1]}; already compiled: {[k[1] for k in self._executables]}"
                )
            executable = self.jitted.lower(*args).compile()
            self._executables[key] = executable
            self.memory[key] = memory_analysis(executable)
            self._flops[key] = _xla_flops(executable)
            if self.repeated is not None:  # XLA counts a scan's body once: the other k − 1 passes added
                k, body = self.repeated
                self._flops[key] += (k - 1) * _xla_flops(body.lower(*args).compile())
        return executable

    def __call__(self, *args):
        key = _signature(args[-1])
        executable = self._compiled(key, args)
        self.flops_done += self._flops[key]
        return executable(*args)

    @property
    def n_compiled(self) -> int:
        return len(self._executables)

    def peak_memory(self) -> dict | None:
        figures = [m for m in self.memory.values() if m is not None]
        if not figures:
            return None

        def total(m):
            return m["argument_bytes"] + m["output_bytes"] + m["temp_bytes"] - m["alias_bytes"]

        worst = max(figures, key=total)
        return worst | {"total_bytes": total(worst), "compiled_shapes": len(self._executables)}


def _xla_flops(executable) -> float:
    """XLA's FLOP count of a compiled program (its cost analysis; NaN where the backend gives none)."""
    try:
        analysis = executable.cost_analysis()
    except Exception:  # noqa: BLE001 -- an optional figure: some backends have no cost model
        return math.nan
    analysis = analysis[0] if isinstance(analysis, list | tuple) and analysis else analysis
    return float(analysis.get("flops", math.nan)) if isinstance(analysis, dict) else math.nan


def describe_memory(memory: dict | None) -> str:
    if memory is None:
        return "no memory analysis on this backend"
    mib = {k: v / 2**20 for k, v in memory.items() if k.endswith("_bytes")}
    return (
        f"arguments {mib['argument_bytes']:.2f} MiB, outputs {mib['output_bytes']:.2f} MiB "
        f"(aliased {mib['alias_bytes']:.2f}), temp {mib['temp_bytes']:.2f} MiB, total {mib['total_bytes']:.2f} MiB"
    )
