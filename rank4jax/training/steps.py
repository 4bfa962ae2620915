"""Pure train and eval steps, jitted with shardings and donation, compiled ahead of time.

``train_step(state, windows) -> (state, metrics)``: dropout keys come from fold_in(rng, step); the
metrics (loss, last-slice sums, and the L2 norms of parameters, gradients and updates) stay on the
device (the loop fetches them every ``log_every`` steps, never every step).

``CompiledStep`` compiles a jitted step ahead of time (``jit(...).lower(...).compile()``) for each
batch shape it meets, keeps each executable's memory analysis (argument, output, temporary bytes),
and refuses to compile more shapes than the batch layout can produce; the step function itself
counts its traces (``trace_limit``, the per-object form of ``chex.assert_max_traces``, whose counter
is shared by every function built from the same code, i.e. by every run in a process), so a stray
retrace (a dtype or a shape the layout does not make) stops the run with a clear message instead
of silently slowing it.
"""

from __future__ import annotations

import functools

import jax
import optax

from rank4jax.errors import RecompilationError
from rank4jax.models.family import ModelFamily
from rank4jax.training.state import TrainState


def trace_limit(fn, limit: int, name: str):
    """``fn`` that raises RecompilationError when traced more than ``limit`` times (its own count)."""
    traces = 0

    @functools.wraps(fn)
    def traced(*args, **kwargs):
        nonlocal traces
        traces += 1
        if traces > limit:
            raise RecompilationError(f"the {name} was traced again: {traces} traces, at most {limit} expected")
        return fn(*args, **kwargs)

    return traced


def train_step(state: TrainState, windows: jax.Array, *, family: ModelFamily, model_cfg, optimizer):
    def loss_fn(params):
        sums = family.loss_sums(params, windows, model_cfg, train=True, rng=state.dropout_key())
        return sums["objective"], sums

    (loss, sums), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {
        "loss": loss,
        "grad_norm": optax.tree.norm(grads),
        "param_norm": optax.tree.norm(params),
        "update_norm": optax.tree.norm(updates),
        "last_slice_ce_sum": sums["last_slice_ce_sum"],
        "last_slice_tokens": sums["last_slice_tokens"],
    }
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def eval_step(params, windows: jax.Array, *, family: ModelFamily, model_cfg) -> dict:
    sums = family.loss_sums(params, windows, model_cfg, train=False)
    sums.pop("objective")
    return sums


def jit_train_step(family, model_cfg, optimizer, state_sharding, batch_sharding, replicated, max_traces=None):
    """``max_traces``: the most batch shapes the step may be traced for (``trace_limit``)."""

    def step(state, windows):
        return train_step(state, windows, family=family, model_cfg=model_cfg, optimizer=optimizer)

    if max_traces is not None:
        step = trace_limit(step, max_traces, "train step")
    return jax.jit(
        step,
        in_shardings=(state_sharding, batch_sharding),
        out_shardings=(state_sharding, replicated),
        donate_argnums=0,
    )


def jit_eval_step(family, model_cfg, params_sharding, batch_sharding, replicated):
    step = functools.partial(eval_step, family=family, model_cfg=model_cfg)
    return jax.jit(step, in_shardings=(params_sharding, batch_sharding), out_shardings=replicated)


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

    ``step(*args)`` runs the executable compiled for the shapes of ``args``; ``compile(*args)``
    compiles (or finds) it without running. ``memory`` maps each compiled shape to its memory
    analysis; ``peak_memory`` is the largest argument + output + temp − alias figure among them.
    """

    def __init__(self, jitted, max_shapes: int, name: str = "train step"):
        self.jitted, self.max_shapes, self.name = jitted, max_shapes, name
        self._executables: dict[tuple, object] = {}
        self.memory: dict[tuple, dict | None] = {}

    def compile(self, *args):
        key = _signature(args[-1])  # the batch; the state's shapes are fixed for a run
        executable = self._executables.get(key)
        if executable is None:
            if len(self._executables) >= self.max_shapes:
                raise RecompilationError(
                    f"the {self.name} would compile for a batch shape beyond the {self.max_shapes} this "
                    f"batch layout can produce: {key[1]}; already compiled: {[k[1] for k in self._executables]}"
                )
            executable = self.jitted.lower(*args).compile()
            self._executables[key] = executable
            self.memory[key] = memory_analysis(executable)
        return executable

    def __call__(self, *args):
        return self.compile(*args)(*args)

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


def describe_memory(memory: dict | None) -> str:
    if memory is None:
        return "no memory analysis on this backend"
    mib = {k: v / 2**20 for k, v in memory.items() if k.endswith("_bytes")}
    return (
        f"arguments {mib['argument_bytes']:.2f} MiB, outputs {mib['output_bytes']:.2f} MiB "
        f"(aliased {mib['alias_bytes']:.2f}), temp {mib['temp_bytes']:.2f} MiB, total {mib['total_bytes']:.2f} MiB"
    )
