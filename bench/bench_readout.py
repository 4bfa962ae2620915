"""The readout + cross-entropy gradient alone: the training path against autodiff through optax.

    python -m bench.bench_readout [--repeats 5]

Y (B·P, D) and the readout factors Esem (V, dx), W′ (V, dt) at the small bench size (B=32, P=64,
dx=16, dt=8, V=4000). Rows (gradient w.r.t. Y, Esem and W′ of the summed CE, alternately timed):
``optax`` = softmax_cross_entropy_with_integer_labels on the logits (its backward scatters into a
(B·P, V) zero tensor); ``fused`` = ``readout_loss_sums`` (logsumexp minus the target logit from the
factors); ``3 matmuls`` = the forward and the two backward matmuls alone, the floor of either.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import optax

from bench.common import interleaved_medians
from rank4jax.models.rank4.codes import apply_readout, readout_matrix
from rank4jax.models.rank4.losses import readout_loss_sums

B, N, T, DX, DT, V = 32, 16, 4, 16, 8, 4000


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    keys = jax.random.split(jax.random.key(0), 4)
    y = jax.random.normal(keys[0], (B, N * T, DX * DT))
    sem = jax.random.normal(keys[1], (V, DX))
    tmp = jax.random.normal(keys[2], (V, DT)) / (DX * DT) ** 0.5
    targets = jax.random.randint(keys[3], (B, T, N), 4, V)

    def optax_ce(y, sem, tmp):
        logits = apply_readout(sem, tmp, y)
        tgt = jnp.swapaxes(targets, 1, 2).reshape(B, -1)
        return jnp.sum(optax.softmax_cross_entropy_with_integer_labels(logits, tgt))

    def fused_ce(y, sem, tmp):
        return readout_loss_sums(y, sem, tmp, targets)["window_ce_sum"]

    def three_matmuls(y, sem, tmp):
        m = readout_matrix(sem, tmp)
        y2 = y.reshape(-1, DX * DT)
        logits = y2 @ m.T
        return logits @ m, logits.T @ y2

    fns = {
        "optax": jax.jit(jax.grad(optax_ce, argnums=(0, 1, 2))),
        "fused": jax.jit(jax.grad(fused_ce, argnums=(0, 1, 2))),
        "3 matmuls": jax.jit(three_matmuls),
    }

    def timer(fn):
        def run():
            jax.block_until_ready(fn(y, sem, tmp))
            t0 = time.perf_counter()
            for _ in range(args.steps):
                out = fn(y, sem, tmp)
            jax.block_until_ready(out)
            return (time.perf_counter() - t0) / args.steps

        return run

    medians = interleaved_medians({name: timer(fn) for name, fn in fns.items()}, args.repeats)
    for name, seconds in medians.items():
        print(f"{name:10s} {seconds * 1e3:7.1f} ms  × {seconds / medians['optax']:.2f} of optax")


if __name__ == "__main__":
    main()
