"""Where the rank-4 train step's time goes: the whole step against its parts, timed separately on
the same batch. The parts: the gradient of the loss (forward and backward), the loss
forward in train mode (dropout) and eval mode, and the AdamW update alone.

    python -m bench.bench_step_parts [--sizes small,medium] [--layouts trimmed,compact]

Sizes as bench_throughput (the peer's synthetic windows). Milliseconds per step, medians of 5 timed
blocks of ``--steps`` calls. Run it on a quiet machine: the figures are absolute.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import jax
import jax.numpy as jnp
import optax

import rank4jax
from bench.bench_throughput import SIZES
from bench.common import synthetic_windows
from configs import default
from rank4jax.data.compact import compact_windows
from rank4jax.data.windows import trim_padding
from rank4jax.engine import sharding
from rank4jax.engine.programs import build_programs, optim_key
from rank4jax.models.family import RANK4

LAYOUTS = {
    "full": lambda w: w,
    "trimmed": lambda w: trim_padding(w, 4),
    "compact": lambda w: compact_windows(w, groups=1, buckets=16),
}


def ms_per_call(fn, steps: int) -> float:
    jax.block_until_ready(fn())
    blocks = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(steps):
            out = fn()
        jax.block_until_ready(out)
        blocks.append((time.perf_counter() - start) / steps * 1e3)
    return statistics.median(blocks)


def step_parts(size: str, layout: str, steps: int) -> dict[str, float]:
    spec = SIZES[size]
    model = {k: spec[k] for k in ("dx", "dt", "n_heads", "n_layers", "vocab_size", "n_tokens", "n_slices")}
    cfg = rank4jax.Rank4Config(**model, dropout=0.1)
    windows = synthetic_windows(spec["batch"], cfg.n_slices, cfg.n_tokens, cfg.vocab_size)
    batch = jax.tree.map(jnp.asarray, LAYOUTS[layout](windows))
    optim = default.get_config().optim
    optim.learning_rate, optim.weight_decay, optim.warmup_steps = 3e-4, 0.01, 0
    programs = build_programs(RANK4, cfg, optim_key(optim), sharding.make_mesh(1, 1))
    state = programs.init(jax.random.key(0))
    params = jax.tree.map(jnp.copy, state.params)  # the train step donates the state's own
    rng = jax.random.key(1)

    def loss(p, train=True):
        return RANK4.loss_sums(p, batch, cfg, train=train, rng=rng if train else None)["objective"]

    grad, forward = jax.jit(jax.grad(loss)), jax.jit(loss, static_argnums=1)
    grads = grad(params)

    @functools.partial(jax.jit, donate_argnums=(0, 1))  # donated, as in the train step
    def update(p, opt_state):
        updates, opt_state = programs.optimizer.update(grads, opt_state, p)
        return optax.apply_updates(p, updates), opt_state

    held = {"state": state, "updated": (jax.tree.map(jnp.copy, params), jax.tree.map(jnp.copy, state.opt_state))}

    def adamw():
        held["updated"] = update(*held["updated"])
        return held["updated"]

    def train_step():
        held["state"], metrics = programs.train_step(held["state"], batch)
        return metrics

    return {
        "gradient": ms_per_call(lambda: grad(params), steps),
        "forward, train": ms_per_call(lambda: forward(params, True), steps),
        "forward, eval": ms_per_call(lambda: forward(params, False), steps),
        "AdamW update": ms_per_call(adamw, steps),
        "train step": ms_per_call(train_step, steps),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="small,medium")
    ap.add_argument("--layouts", default="trimmed,compact")
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    for size in args.sizes.split(","):
        for layout in args.layouts.split(","):
            parts = step_parts(size, layout, args.steps)
            print(f"{size:<7} {layout:<8} " + "  ".join(f"{name} {ms:7.2f} ms" for name, ms in parts.items()))


if __name__ == "__main__":
    main()
