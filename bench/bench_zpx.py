"""Train-step time of the ZPX score variants against the standard score, for both families.

    python -m bench.bench_zpx [--repeats 5] [--steps 5]

Sizes of configs/storycloze.py (rank-4: dx=16, dt=8, H=2, L=2; baseline: dx=12, dt=8), V=3,135,
N=16, T=4, B=32, dropout 0.2, C=8 channels; windows as the throughput bench (3 PAD positions per
state). Variants run alternately in one process; medians, and the ratio to the standard score.
"""

from __future__ import annotations

import argparse

from bench.common import compiled_train_step, interleaved_medians, run_steps, step_timer, synthetic_windows
from rank4jax.models import baseline, rank4, zpx
from rank4jax.models.family import BASELINE, RANK4
from rank4jax.models.scores import STANDARD

SIZES = dict(vocab_size=3135, n_tokens=16, n_slices=4, n_heads=2, n_layers=2, dropout=0.2)
FAMILIES = {
    "rank4": (RANK4, rank4.Rank4Config, dict(dx=16, dt=8)),
    "baseline": (BASELINE, baseline.BaselineConfig, dict(dx=12, dt=8)),
}
VARIANTS = {
    "standard": STANDARD,
    "zpx_angle": zpx.ZPXConfig(score="zpx_angle"),
    "zpx_angle_sphere": zpx.ZPXConfig(score="zpx_angle_sphere"),
    "zpx_angle_sphere+centre": zpx.ZPXConfig(score="zpx_angle_sphere", center_weight=0.01),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    windows = synthetic_windows(32, SIZES["n_slices"], SIZES["n_tokens"], SIZES["vocab_size"])
    for name, (family, cfg_cls, fiber) in FAMILIES.items():
        timers = {}
        for variant, z in VARIANTS.items():
            cfg = cfg_cls(**SIZES, **fiber, score=z)
            compiled, state, _, _ = compiled_train_step(cfg, windows, family=family)
            run = {"step": compiled, "state": run_steps(compiled, state, windows, 2)[1], "batch": windows}
            timers[variant] = step_timer(run, args.steps)
        medians = interleaved_medians(timers, args.repeats)
        for variant, seconds in medians.items():
            print(f"{name:9s} {variant:24s} {seconds * 1e3:8.1f} ms/step  × {seconds / medians['standard']:.2f}")


if __name__ == "__main__":
    main()
