"""Evaluation speed on a trained run: the plain eval pass against the training step on the same
windows, and the whole ``eval.py`` work against its own plain pass.

    python -m bench.bench_eval --workdir=runs/rocstories [--split=validation --repeats 3]

All in one process, side by side:

1. windows/s of the training step (the run's batch size and batch layout; a fresh optimiser state
   on the restored parameters) and of the plain eval pass (``evaluate_windows``, the run's layout
   and eval batch size, and the full-width pass for reference) over the split's windows. Every
   batch shape is compiled in a first pass; the timed passes alternate, medians reported.
2. ``evaluate_run`` as ``eval.py`` calls it (fresh jitted functions, compile included): its total
   time over the time of its own plain pass, and each part (cloze, examples, rollout).
"""

from __future__ import annotations

import argparse
import functools
import time

import jax
import numpy as np

from bench.common import interleaved_medians
from rank4jax.checkpoint.storage import RunCheckpoints
from rank4jax.engine import sharding
from rank4jax.engine.batches import batch_layout
from rank4jax.engine.data_setup import prepare_split
from rank4jax.engine.programs import build_programs, optim_key
from rank4jax.evaluation.evaluators import Evaluators
from rank4jax.evaluation.report import evaluate_run
from rank4jax.runs import restore_run


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--split", default="validation")
    ap.add_argument("--step", default="best")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rollout_steps", type=int, default=3)
    return ap.parse_args()


def main():
    args = parse_args()
    mesh = sharding.make_mesh(1, 1)

    def place(run):
        params = run.abstract_state.params
        return sharding.with_shardings(params, sharding.state_shardings(mesh, params))

    with RunCheckpoints(args.workdir, read_only=True) as ckpt:
        run, params = restore_run(ckpt, args.step, place)
    config, family, model_cfg = run.config, run.family, run.model_cfg
    windows = prepare_split(config, run.tokenizer, args.split)[1].windows
    layout = batch_layout(config, family, model_cfg, groups=1)
    programs = build_programs(family, model_cfg, optim_key(config.optim), mesh)
    batch_sharding, train_step = programs.batch_sharding, programs.train_step
    state = programs.init(jax.random.key(0)).replace(params=params)  # fresh optimiser moments
    n_train = len(windows) - len(windows) % config.batch_size
    train_batches = [
        sharding.put_batch(layout(windows[i : i + config.batch_size]), batch_sharding)
        for i in range(0, n_train, config.batch_size)
    ]
    run_state = {"state": state}

    def train_pass() -> float:
        start, metrics = time.perf_counter(), None
        for batch in train_batches:
            run_state["state"], metrics = train_step(run_state["state"], batch)
        jax.block_until_ready(metrics)
        return time.perf_counter() - start

    def eval_pass(use_layout) -> float:
        start = time.perf_counter()
        params = run_state["state"].params  # the training step donates its input state
        Evaluators(programs, config.eval_batch_size, use_layout).windows(params, windows)
        return time.perf_counter() - start

    runners = {
        "train step": train_pass,
        f"eval pass ({layout.name})": functools.partial(eval_pass, layout),
        "eval pass (full width)": functools.partial(eval_pass, None),
    }
    for runner in runners.values():  # compile every shape
        runner()
    medians = interleaved_medians(runners, args.repeats)
    counts = {"train step": n_train}
    print(f"{family.name}, {len(windows)} {args.split} windows, V = {run.tokenizer.vocab_size}")
    train_rate = n_train / medians["train step"]
    for name, seconds in medians.items():
        rate = counts.get(name, len(windows)) / seconds
        print(f"  {name:<24}{rate:>10.1f} windows/s {rate / train_rate:>8.2f}× the training step")

    report = evaluate_run(args.workdir, args.split, args.step, rollout_steps=args.rollout_steps)
    t = report["timings_s"]
    print(
        f"evaluate_run (eval.py's work, compile included): total {t['total']:.1f} s = "
        f"{t['total'] / t['windows']:.2f}× its plain pass ({t['windows']:.1f} s)"
    )
    print("  " + ", ".join(f"{k} {v:.1f} s" for k, v in t.items()))


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
