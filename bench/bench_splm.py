"""Train-step time of the SPLM's two potentials (Gaussian V_θ, MLP V_θ) and the matched attention LM,
at the sizes of ``splm_report.py``: the built-in corpus (V = 147, N = 12) and ROCStories
(V = 14,171, N = 16); d = 64, L = 4, K_ξ = 4 banks of 8 wells, B = 32, T = 4. The MLP's hidden width
and the attention model's depth are matched to the Gaussian's parameter count as the report does.

    python -m bench.bench_splm [--repeats 5] [--steps 5] [--sizes builtin,rocstories]

The three models run alternately in one process; medians, and the ratio to the SPLM-MLP.
"""

from __future__ import annotations

import argparse

from bench.common import compiled_train_step, interleaved_medians, run_steps, step_timer, synthetic_windows
from configs import splm as splm_config
from rank4jax.experiments.splm_report import matched_configs
from rank4jax.models.family import get_family

SIZES = {"builtin": dict(vocab_size=147, n_tokens=12), "rocstories": dict(vocab_size=14171, n_tokens=16)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--sizes", default="builtin,rocstories")
    args = ap.parse_args()
    for size in args.sizes.split(","):
        vocab, n_tokens = SIZES[size]["vocab_size"], SIZES[size]["n_tokens"]
        base = splm_config.get_config()
        base.model.n_tokens = n_tokens
        timers = {}
        for name, config in matched_configs(base, vocab).items():
            family = get_family(config.model_family)
            cfg = family.make_config(config.model, vocab)
            windows = synthetic_windows(config.batch_size, cfg.n_slices, cfg.n_tokens, vocab)
            compiled, state, _, _ = compiled_train_step(cfg, windows, learning_rate=1e-3, family=family)
            run = {"step": compiled, "state": run_steps(compiled, state, windows, 2)[1], "batch": windows}
            timers[name] = step_timer(run, args.steps)
        medians = interleaved_medians(timers, args.repeats)
        for name, seconds in medians.items():
            ratio = seconds / medians["splm_mlp"]
            print(f"{size:10s} {name:14s} {seconds * 1e3:8.1f} ms/step  × {ratio:.2f} of splm_mlp")


if __name__ == "__main__":
    main()
