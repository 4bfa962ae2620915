"""Training windows/s on one device vs a data-parallel and a head-parallel mesh of 2 devices.

    python -m bench.bench_sharding [--repeats 5 --steps 10]

On a CPU host the two devices are simulated (``--xla_force_host_platform_device_count=2``, set
here before jax starts), so they share the same cores: this measures the partitioning overhead, not
a speed-up. The three meshes run alternately in one process on identical windows.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip()

import argparse  # noqa: E402

import jax  # noqa: E402

import rank4jax  # noqa: E402
from bench.common import interleaved_medians, run_steps, step_timer, synthetic_windows  # noqa: E402
from rank4jax.engine import sharding  # noqa: E402
from rank4jax.engine.programs import build_programs  # noqa: E402
from rank4jax.models.family import RANK4  # noqa: E402

MESHES = {"1 device": (1, 1), "data=2": (2, 1), "model=2": (1, 2)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    cfg = rank4jax.Rank4Config(vocab_size=4000, n_tokens=16, n_slices=4, dx=16, dt=8, n_heads=2, n_layers=2)
    batch = 32
    windows = synthetic_windows(batch, cfg.n_slices, cfg.n_tokens, cfg.vocab_size)
    optim = (("b1", 0.9), ("b2", 0.999), ("eps", 1e-8), ("grad_clip_norm", 0.0), ("learning_rate", 3e-4))
    optim += (("warmup_steps", 0), ("weight_decay", 0.01))  # AdamW as the training configs build it
    runs = {}
    for name, (data, model) in MESHES.items():
        mesh = sharding.make_mesh(data, model)
        programs = build_programs(RANK4, cfg, optim, mesh)
        state, step = programs.init(jax.random.key(0)), programs.train_step
        placed = sharding.put_batch(windows, programs.batch_sharding)
        _, state = run_steps(step, state, placed, 2)  # compile + warm-up
        runs[name] = {"step": step, "state": state, "batch": placed}

    medians = interleaved_medians({name: step_timer(run, args.steps) for name, run in runs.items()}, args.repeats)
    print(f"devices: {jax.device_count()} ({jax.devices()[0].platform}); batch {batch}")
    print(f"{'mesh':<10}{'windows/s':>12}{'ratio vs 1 device':>20}")
    for name, seconds in medians.items():
        print(f"{name:<10}{batch / seconds:>12.1f}{medians['1 device'] / seconds:>20.3f}")


if __name__ == "__main__":
    main()
