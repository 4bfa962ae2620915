"""Pure train and eval steps, jitted with shardings and donation.

``train_step(state, windows) -> (state, metrics)``: dropout keys come from fold_in(rng, step); the
metrics stay on the device (the loop fetches them every ``log_every`` steps, never every step).
"""

from __future__ import annotations

import functools

import jax
import optax

from rank4jax.models.family import ModelFamily
from rank4jax.training.state import TrainState


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
        "last_slice_ce_sum": sums["last_slice_ce_sum"],
        "last_slice_tokens": sums["last_slice_tokens"],
    }
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def eval_step(params, windows: jax.Array, *, family: ModelFamily, model_cfg) -> dict:
    sums = family.loss_sums(params, windows, model_cfg, train=False)
    sums.pop("objective")
    return sums


def jit_train_step(family, model_cfg, optimizer, state_sharding, batch_sharding, replicated):
    step = functools.partial(train_step, family=family, model_cfg=model_cfg, optimizer=optimizer)
    return jax.jit(
        step,
        in_shardings=(state_sharding, batch_sharding),
        out_shardings=(state_sharding, replicated),
        donate_argnums=0,
    )


def jit_eval_step(family, model_cfg, params_sharding, batch_sharding, replicated):
    step = functools.partial(eval_step, family=family, model_cfg=model_cfg)
    return jax.jit(step, in_shardings=(params_sharding, batch_sharding), out_shardings=replicated)
