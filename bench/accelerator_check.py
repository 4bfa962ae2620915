"""One command for a lent accelerator: the paper-size train steps in three precisions, the
free-running baseline against the rank-4 model, and a short bf16 ``train.py`` run on ROCStories.

    python -m bench.accelerator_check                 # on one GPU/TPU: paper size, under 8 minutes
    python -m bench.accelerator_check --tiny          # anywhere: a tiny size, end to end (CI runs it)

On a fresh machine: the README's install, then ``pip install -e ".[cuda]"`` (JAX's CUDA wheels).

One table, a row per family and precision — float32 (matmuls at "highest" precision), TF32
(float32 with "tensorfloat32" matmuls) and bf16 (``compute_dtype=bfloat16``): train-step windows/s
(best of ``--rounds`` timed blocks of ``--steps`` steps), achieved TFLOP/s by the analytic model count
(``rank4jax.models.flops``, the count the training log uses), its fraction of the device's dense
bf16 peak (``rank4jax.training.utilization``; "-" where the device is not in the table, as on a
CPU), and the compiled step's peak memory (arguments + outputs + temporaries). Then the baseline's
step time over the rank-4 step time in each precision (the paper reports 18.8× in wall time), and
a training run of ``configs/rocstories_paper.py`` in bf16 on the shared ROCStories file (the
built-in corpus with ``--tiny``), the trainer ``train.py`` runs, in this process: the windows/s and
MFU it logged and its first validation LS(T).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import time

import jax
import numpy as np

from bench.common import compiled_train_step, peak_bytes, run_steps, synthetic_windows
from configs import baseline_paper, default, rocstories_paper
from rank4jax.models.family import BASELINE, RANK4
from rank4jax.models.flops import train_flops_per_window
from rank4jax.training.loop import train
from rank4jax.training.metrics import read_metrics
from rank4jax.training.utilization import bf16_peak_flops

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROCSTORIES = os.path.join(REPO, "..", "shared", "data", "rocstories_spring2016_first45000.csv")
PRECISIONS = {"float32": ("float32", "highest"), "tf32": ("float32", "tensorfloat32"), "bf16": ("bfloat16", None)}
PAPER_VOCAB = 36_711
# --tiny: the sizes of the test suite's tiny runs (tests/helpers.tiny_config), so CI's run of this
# check reuses the programs the suite compiles anyway
TINY = dict(n_tokens=8, n_slices=4, dx=4, dt=2, n_heads=2, n_layers=1)
TINY_RUN = dict(batch_size=8, eval_batch_size=16, compact_buckets=8)


def family_configs(tiny: bool) -> dict:
    """{family name: (family, model config)} at the paper's sizes (or tiny ones), V = 36,711 (or 200)."""
    vocab = 200 if tiny else PAPER_VOCAB
    out = {}
    for family, config in ((RANK4, rocstories_paper.get_config()), (BASELINE, baseline_paper.get_config())):
        section = config.model
        if tiny:
            section.update(TINY)
        out[family.name] = (family, family.make_config(section, vocab))
    return out


def step_row(family, cfg, windows, precision: str, args) -> dict:
    """One row of the table: the train step of ``family`` in ``precision`` on ``windows``."""
    compute, matmul = PRECISIONS[precision]
    windows = jax.device_put(windows)  # on the device once: the timing is the step's, not the transfer's
    scope = jax.default_matmul_precision(matmul) if matmul else contextlib.nullcontext()
    with scope:  # the matmul precision applies when the step is traced and compiled
        compiled, state, compile_s, memory = compiled_train_step(cfg, windows, family=family, compute_dtype=compute)
    _, state = run_steps(compiled, state, windows, 2)  # warm
    best = float("inf")
    for _ in range(args.rounds):
        seconds, state = run_steps(compiled, state, windows, args.steps)
        best = min(best, seconds / args.steps)
    rate = len(windows) / best
    tflops = rate * train_flops_per_window(family, cfg) / 1e12
    peak = bf16_peak_flops(jax.devices()[0])
    return {
        "family": family.name,
        "precision": precision,
        "step_ms": 1e3 * best,
        "windows_per_s": rate,
        "tflops": tflops,
        "bf16_peak_fraction": tflops * 1e12 / peak if peak else None,
        "peak_memory_gib": peak_bytes(memory) / 2**30 if memory is not None else None,
        "compile_s": compile_s,
    }


def train_run(args) -> dict:
    """A bf16 training run, as ``train.py`` runs it (the same ``train`` on the same config, in this
    process): its logged windows/s and MFU (median after the first interval) and its first
    validation LS(T)."""
    steps = args.train_steps
    config = (default if args.tiny else rocstories_paper).get_config()
    config.batch_layout = "rule"  # the config's own layout, untimed: three fewer compiles at the paper size
    if args.tiny:  # a small corpus: seconds, not minutes
        config.model.update(TINY)
        config.update(TINY_RUN)
        config.data.builtin_stories, config.optim.warmup_steps = 200, 0
    else:
        config.data.path = args.data
    config.compute_dtype = "bfloat16"
    config.num_steps = config.eval_every = config.checkpoint_every = steps
    config.log_every, config.progress_bar = max(steps // 10, 1), False
    with tempfile.TemporaryDirectory(prefix="rank4jax_accel_") as workdir:  # its checkpoints are not kept
        start = time.perf_counter()
        train(config, workdir)
        wall = time.perf_counter() - start
        records = read_metrics(workdir)
    logged = records["train"][1:] or records["train"]  # the first interval holds the first batches' waits
    validation = records["validation"][0]
    return {
        "config": "configs/default.py" if args.tiny else "configs/rocstories_paper.py",
        "steps": steps,
        "wall_s": wall,
        "windows_per_s": float(np.median([r["windows_per_s"] for r in logged])),
        "mfu": float(np.median([r["mfu"] for r in logged])) if "mfu" in logged[0] else None,
        "first_validation_step": validation["step"],
        "first_validation_last_slice_ce": validation["last_slice_ce"],
    }


def fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_table(rows: list[dict], run: dict | None) -> None:
    device = jax.devices()[0]
    print(f"device: {device.platform} {device.device_kind} (bf16 peak {fmt(bf16_peak_flops(device), '.3g')} FLOP/s)")
    print("| family | precision | step ms | windows/s | TFLOP/s | of bf16 peak | peak memory GiB | compile s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['family']} | {r['precision']} | {r['step_ms']:.2f} | {r['windows_per_s']:.1f} | {r['tflops']:.3g} "
            f"| {fmt(r['bf16_peak_fraction'], '.1%')} | {fmt(r['peak_memory_gib'], '.2f')} | {r['compile_s']:.1f} |"
        )
    for precision in PRECISIONS:
        by = {r["family"]: r for r in rows if r["precision"] == precision}
        if len(by) == 2:
            ratio = by["baseline"]["step_ms"] / by["rank4"]["step_ms"]
            print(f"baseline (free-running) step time / rank-4 step time, {precision}: {ratio:.2f}x")
    if run:
        print(
            f"training run {run['config']} bf16, {run['steps']} steps in {run['wall_s']:.0f} s: "
            f"{run['windows_per_s']:.1f} windows/s, MFU {fmt(run['mfu'], '.1%')}, "
            f"first validation (step {run['first_validation_step']}) LS(T) {run['first_validation_last_slice_ce']:.4f}"
        )


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="a tiny size and the built-in corpus (any machine)")
    ap.add_argument("--batch", type=int, default=None, help="windows per step (default 32; 8 with --tiny)")
    ap.add_argument("--steps", type=int, default=10, help="steps per timed block")
    ap.add_argument("--rounds", type=int, default=3, help="timed blocks; the best counts")
    ap.add_argument("--precisions", default=",".join(PRECISIONS), help="comma-separated, from float32,tf32,bf16")
    ap.add_argument("--train_steps", type=int, default=None, help="the train.py run's steps (300; 20 with --tiny)")
    ap.add_argument("--data", default=ROCSTORIES, help="the ROCStories CSV of the train.py run")
    args = ap.parse_args(argv)
    args.batch = args.batch or (8 if args.tiny else 32)
    args.train_steps = args.train_steps or (20 if args.tiny else 300)
    if not args.tiny and not os.path.isfile(args.data):
        raise SystemExit(f"error: {args.data} not found (pass --data, or --tiny for the built-in corpus)")
    rows = []
    for family, cfg in family_configs(args.tiny).values():
        windows = synthetic_windows(args.batch, cfg.n_slices, cfg.n_tokens, cfg.vocab_size)
        for precision in args.precisions.split(","):
            rows.append(step_row(family, cfg, windows, precision, args))
            print(json.dumps(rows[-1]), flush=True)
    run = train_run(args) if args.train_steps > 0 else None
    print_table(rows, run)


if __name__ == "__main__":
    main()
