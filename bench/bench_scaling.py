"""How the rank-4 train step's time grows with the number of positions N·T and with the width D.

    python -m bench.bench_scaling [--repeats 3] [--steps 5] [--batch 16]

Positions: N·T ∈ {16, 64, 256} at dx=16, dt=8 (D=128). Width: D ∈ {32, 128, 512} at N=16, T=4. H=2,
L=2, V=4000, dropout 0.1, full-width windows (no PAD). Each row gives ms per step, the ratio to the
first row of its sweep, and the analytic FLOPs ratio, so super-linear growth (the N·T × N·T score
grid, D² projections) is visible next to the arithmetic it implies.
"""

from __future__ import annotations

import argparse
import statistics

import rank4jax
from bench.common import compiled_train_step, run_steps, step_timer, synthetic_windows
from rank4jax.models.flops import rank4_forward as forward_flops_per_window

POSITIONS = [(4, 4), (16, 4), (32, 8)]  # (N, T)
WIDTHS = [(8, 4), (16, 8), (32, 16)]  # (dx, dt)


def time_config(cfg: rank4jax.Rank4Config, batch: int, repeats: int, steps: int) -> float:
    windows = synthetic_windows(batch, cfg.n_slices, cfg.n_tokens, cfg.vocab_size, pad_tail=0)
    compiled, state, _, _ = compiled_train_step(cfg, windows)
    run = {"step": compiled, "state": run_steps(compiled, state, windows, 2)[1], "batch": windows}
    timer = step_timer(run, steps)
    return statistics.median(timer() for _ in range(repeats))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()
    base = dict(vocab_size=4000, n_heads=2, n_layers=2, dropout=0.1)
    sweeps = {
        "N·T": [dict(n_tokens=n, n_slices=t, dx=16, dt=8) for n, t in POSITIONS],
        "D": [dict(n_tokens=16, n_slices=4, dx=dx, dt=dt) for dx, dt in WIDTHS],
    }
    for axis, sizes in sweeps.items():
        first = None
        for size in sizes:
            cfg = rank4jax.Rank4Config(**base, **size)
            seconds = time_config(cfg, args.batch, args.repeats, args.steps)
            flops = forward_flops_per_window(cfg)
            first = first or (seconds, flops)
            value = cfg.n_tokens * cfg.n_slices if axis == "N·T" else cfg.width
            print(
                f"{axis}={value:<4} (N={cfg.n_tokens}, T={cfg.n_slices}, dx={cfg.dx}, dt={cfg.dt}) "
                f"{seconds * 1e3:8.1f} ms/step  time ×{seconds / first[0]:6.2f}  FLOPs ×{flops / first[1]:6.2f}"
            )


if __name__ == "__main__":
    main()
