"""rank4jax train and eval step throughput against the eager PyTorch peer, side by side.

    python -m bench.bench_throughput [--pairs 5] [--torch ../shared/bench/torch_rank4.py]

For each size (small: dx=16, dt=8, H=2, L=2, V=4000, N=16, T=4, B=32; medium: dx=32, dt=16, B=16)
it reports the rank4jax train step and forward-only eval step: windows/s, tokens/s (N·T positions
per window), model FLOPs per window counted analytically, achieved GFLOP/s and its ratio to this
machine's float32 matmul peak (measured in the same run), compile time and compiled peak memory.
It then runs the PyTorch script (``torch_rank4.py``, which needs ``pip install torch``) and
rank4jax alternately, ``--pairs`` times, and prints the ratio of the medians. The synthetic
windows are the PyTorch script's: random tokens with the last 3 positions of every state PAD.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp

import rank4jax
from bench.common import compiled_train_step, peak_bytes, run_steps, step_timer, synthetic_windows
from rank4jax.models.family import RANK4

SIZES = {
    "small": dict(dx=16, dt=8, n_heads=2, n_layers=2, vocab_size=4000, n_tokens=16, n_slices=4, batch=32),
    "medium": dict(dx=32, dt=16, n_heads=2, n_layers=2, vocab_size=4000, n_tokens=16, n_slices=4, batch=16),
}
DEFAULT_TORCH = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "bench", "torch_rank4.py")


def forward_flops_per_window(cfg: rank4jax.Rank4Config) -> int:
    """Multiply-adds × 2 of one window's forward pass (matmuls and attention contractions)."""
    p, d, h = cfg.n_tokens * cfg.n_slices, cfg.width, cfg.n_heads
    per_layer = 2 * 3 * h * p * d * d + 2 * 2 * h * p * p * d + 2 * 2 * p * d * 4 * d
    return cfg.n_layers * per_layer + 2 * p * d * cfg.vocab_size


def matmul_peak_gflops(n: int = 2048, repeats: int = 10) -> float:
    a = jnp.ones((n, n), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        f(a).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def eval_seconds(compiled, params, windows, steps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(steps):
        out = compiled(params, windows)
    jax.block_until_ready(out)
    return (time.perf_counter() - t0) / steps


def torch_windows_per_s(script: str, spec: dict, steps: int) -> float:
    args = [sys.executable, script, "--dx", str(spec["dx"]), "--dt", str(spec["dt"]), "--H", str(spec["n_heads"])]
    args += ["--L", str(spec["n_layers"]), "--V", str(spec["vocab_size"]), "--N", str(spec["n_tokens"])]
    args += ["--T", str(spec["n_slices"]), "--B", str(spec["batch"]), "--steps", str(steps)]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return float(re.search(r"torch_windows_per_s=([0-9.]+)", out).group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--torch", default=DEFAULT_TORCH, help="path of torch_rank4.py ('' to skip)")
    args = ap.parse_args()
    peak = matmul_peak_gflops()
    print(f"float32 matmul peak (2048², jitted): {peak:.1f} GFLOP/s on {jax.devices()[0].device_kind}")
    for size, spec in SIZES.items():
        model = {k: v for k, v in spec.items() if k != "batch"}
        cfg = rank4jax.Rank4Config(**model, dropout=0.1)
        batch = spec["batch"]
        windows = synthetic_windows(batch, cfg.n_slices, cfg.n_tokens, cfg.vocab_size)
        fwd = forward_flops_per_window(cfg)
        compiled, state, compile_s, memory = compiled_train_step(cfg, windows)
        train_run = {"step": compiled, "state": run_steps(compiled, state, windows, 2)[1], "batch": windows}
        params = jax.tree_util.tree_map(jnp.copy, train_run["state"].params)  # the train step donates its state
        eval_fn = jax.jit(functools.partial(RANK4.loss_sums, cfg=cfg))
        t0 = time.perf_counter()
        eval_compiled = eval_fn.lower(params, windows).compile()
        eval_compile_s = time.perf_counter() - t0
        jax.block_until_ready(eval_compiled(params, windows))

        jax_times, torch_rates = [], []
        eval_times = [eval_seconds(eval_compiled, params, windows, args.steps) for _ in range(3)]
        for _ in range(args.pairs):
            jax_times.append(step_timer(train_run, args.steps)())
            if args.torch:
                torch_rates.append(torch_windows_per_s(args.torch, spec, args.steps))
        train_s, eval_s = statistics.median(jax_times), statistics.median(eval_times)
        positions = cfg.n_tokens * cfg.n_slices
        for step, seconds, flops, comp_s, mem in (
            ("train", train_s, 3 * fwd, compile_s, peak_bytes(memory)),
            ("eval", eval_s, fwd, eval_compile_s, peak_bytes(eval_compiled.memory_analysis())),
        ):
            gflops = batch * flops / seconds / 1e9
            print(
                f"{size:<7}{step:<6} {batch / seconds:9.1f} windows/s {batch * positions / seconds:10.0f} tokens/s "
                f"{flops / 1e6:8.1f} MFLOP/window {gflops:7.1f} GFLOP/s ({gflops / peak:.2f} of peak) "
                f"compile {comp_s:5.2f} s  peak memory {mem / 2**20:7.1f} MiB"
            )
        if torch_rates:
            torch_median = statistics.median(torch_rates)
            print(
                f"{size:<7}torch  {torch_median:9.1f} windows/s (median of {len(torch_rates)}); "
                f"rank4jax / torch = {batch / train_s / torch_median:.2f}"
            )


if __name__ == "__main__":
    main()
