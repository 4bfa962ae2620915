"""TrainState and the AdamW optimiser (SPEC §5)."""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import optax

from rank4jax.models.family import ModelFamily


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # int32 scalar: optimiser steps taken
    params: dict
    opt_state: optax.OptState
    rng: jax.Array  # raw uint32 key data; per-step keys are fold_in(rng, step)

    def dropout_key(self) -> jax.Array:
        return jax.random.fold_in(jax.random.wrap_key_data(self.rng), self.step)


BUFFERS = "buffers"  # a top-level params entry of fixed, data-derived arrays: never decayed, zero gradient


def _decayed(params):
    """Weight-decay mask: every array except those under params["buffers"]."""
    return {k: jax.tree_util.tree_map(lambda _, keep=k != BUFFERS: keep, v) for k, v in params.items()}


SCHEDULES = ("constant", "cosine", "linear")  # optim.schedule: after the warmup, to end_lr_factor × lr


def learning_rate_schedule(optim, num_steps: int = 0) -> optax.Schedule:
    """The learning rate at each step: a linear warmup from 0 over ``optim.warmup_steps``, then
    ``optim.schedule``: constant (the paper's), or a cosine or linear decay to
    ``optim.end_lr_factor`` × the rate at ``num_steps`` (optax's schedules)."""
    peak, warmup = optim.learning_rate, int(optim.warmup_steps)
    decay = max(int(num_steps) - warmup, 1)
    after = {
        "constant": lambda: optax.constant_schedule(peak),
        "cosine": lambda: optax.cosine_decay_schedule(peak, decay, alpha=optim.end_lr_factor),
        "linear": lambda: optax.linear_schedule(peak, peak * optim.end_lr_factor, decay),
    }[optim.schedule]()
    if warmup <= 0:
        return after
    return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), after], [warmup])


def make_optimizer(optim, num_steps: int = 0) -> optax.GradientTransformation:
    """AdamW (lr 3e-4, wd 0.01, β = (0.9, 0.999), ε = 1e-8 in the paper) at
    :func:`learning_rate_schedule` (constant without a warmup: a plain rate, no schedule state), with
    optional global-norm clipping (0 = off). ``num_steps``: the end of a decaying schedule."""
    scheduled = optim.warmup_steps > 0 or optim.schedule != "constant"
    lr = learning_rate_schedule(optim, num_steps) if scheduled else optim.learning_rate
    adamw = optax.adamw(lr, b1=optim.b1, b2=optim.b2, eps=optim.eps, weight_decay=optim.weight_decay, mask=_decayed)
    if optim.grad_clip_norm > 0:
        return optax.chain(optax.clip_by_global_norm(optim.grad_clip_norm), adamw)
    return adamw


def create_train_state(key: jax.Array, family: ModelFamily, model_cfg, optimizer) -> TrainState:
    """Pure: jit it with ``out_shardings`` to create the state directly on the devices."""
    init_key, dropout_key = jax.random.split(key)
    params = family.init(init_key, model_cfg)
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=optimizer.init(params),
        rng=jax.random.key_data(dropout_key),
    )


def abstract_train_state(optim, family: ModelFamily, model_cfg) -> TrainState:
    """The train state's shapes and dtypes (ShapeDtypeStructs) under the ``optim`` settings; nothing
    is allocated (a schedule's length changes no shape)."""
    optimizer = make_optimizer(optim, num_steps=1)
    return jax.eval_shape(lambda key: create_train_state(key, family, model_cfg, optimizer), jax.random.key(0))


def _of_type(tree, cls) -> list:
    return [x for x in jax.tree_util.tree_leaves(tree, is_leaf=lambda x: isinstance(x, cls)) if isinstance(x, cls)]


def carry_optimizer_state(old_opt_state, new_opt_state, step: jax.Array):
    """The new optimiser's state with what the old one had learnt: Adam's moments and count are
    carried over, a schedule's count is set to ``step`` (so a new warmup schedule is at the right
    point), clipping and weight decay hold no state. For resuming with changed ``optim`` settings."""
    (adam,) = _of_type(old_opt_state, optax.ScaleByAdamState)

    def carry(x):
        if isinstance(x, optax.ScaleByAdamState):
            return adam
        if isinstance(x, optax.ScaleByScheduleState):
            # a copy: sharing the step's buffer would donate one buffer twice in the train step
            return optax.ScaleByScheduleState(count=jnp.array(step, x.count.dtype, copy=True))
        return x

    is_state = lambda x: isinstance(x, (optax.ScaleByAdamState, optax.ScaleByScheduleState))  # noqa: E731
    return jax.tree_util.tree_map(carry, new_opt_state, is_leaf=is_state)
