"""Analytic (§6 custom VJP) vs autodiff attention: one training step's time and peak memory.

    python -m bench.bench_analytic [--repeats 7 --steps 10]

Both modes run in the same process, alternately, on identical windows and parameters; the figures
are ratios analytic / autodiff. Peak memory is the compiled program's footprint (arguments +
outputs + XLA temporaries, from ``memory_analysis``), which is deterministic.

A variant whose backward recomputes A instead of storing it was measured and dropped: XLA's
compiled peak was identical to storing A at all three sizes.
"""

from __future__ import annotations

import argparse
import dataclasses

import rank4jax
from bench.common import compiled_train_step, interleaved_medians, peak_bytes, run_steps, step_timer, synthetic_windows

SIZES = {
    "small": dict(vocab_size=4000, n_tokens=16, n_slices=4, dx=16, dt=8, n_heads=2, n_layers=2, batch=32),
    "medium": dict(vocab_size=4000, n_tokens=16, n_slices=4, dx=32, dt=16, n_heads=2, n_layers=2, batch=16),
    # N·T = 256 positions: the (B, H, P, K) attention tensors dominate memory here
    "long": dict(vocab_size=1000, n_tokens=64, n_slices=4, dx=8, dt=4, n_heads=4, n_layers=2, batch=16),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    print(f"{'size':<8}{'mode':<20}{'compile s':>10}{'step ms':>10}{'peak MiB':>10}{'time ratio':>12}{'mem ratio':>11}")
    for size, spec in SIZES.items():
        spec = dict(spec)
        batch = spec.pop("batch")
        base = rank4jax.Rank4Config(**spec, dropout=0.1)
        windows = synthetic_windows(batch, base.n_slices, base.n_tokens, base.vocab_size)
        runs = {}
        for mode in ("autodiff", "analytic"):
            cfg = dataclasses.replace(base, attention=mode)
            compiled, state, compile_s, memory = compiled_train_step(cfg, windows)
            _, state = run_steps(compiled, state, windows, 2)  # warm-up
            runs[mode] = {"step": compiled, "state": state, "batch": windows, "compile_s": compile_s}
            runs[mode]["peak"] = peak_bytes(memory)

        medians = interleaved_medians({m: step_timer(runs[m], args.steps) for m in runs}, args.repeats)
        for mode, r in runs.items():
            t_ratio = medians[mode] / medians["autodiff"]
            m_ratio = r["peak"] / runs["autodiff"]["peak"]
            print(
                f"{size:<8}{mode:<20}{r['compile_s']:>10.2f}{medians[mode] * 1e3:>10.2f}{r['peak'] / 2**20:>10.1f}"
                f"{t_ratio:>12.3f}{m_ratio:>11.3f}"
            )


if __name__ == "__main__":
    main()
