"""The paper's comparison at the paper's size on one GPU, in one command that ends within 5 minutes on
an H200: the rank-4 model of ``configs/rocstories_paper.py`` (dx = 64, dt = 32, H = 4, L = 2, bf16
compute) and the parameter-matched free-running 1-D baseline (the size ladder's matching), on the
45,000 ROCStories split as the ladder splits them, each trained for the same wall-time budget, then
evaluated as the ladder evaluates: test LS(T), Δ, context gain, Story Cloze by mean CE, PMI and
ending only on the 1,571 validation stories, with McNemar's exact test per rule.

    bash bench/prepare_device.sh                            # first, here: wheels and data into .device_run/
    python -m bench.paper_comparison --tiny --out=runs/pc   # anywhere: the same code at a tiny size

On the lent GPU machine (its image has JAX and CUDA; ``.device_run`` carried, about 7 minutes
allowed), the wheels installed ahead of the image's packages, then the comparison:

    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device_run/wheels/*.whl \
      && PYTHONPATH=/tmp/site:. python3 -m bench.paper_comparison --out=$OUT 2>&1 | tee $OUT/log.txt

Why a wall-time budget and not each run's validation optimum: the paper trained for 2.4 h (rank-4)
and 45.2 h (baseline) on two RTX 3080s; the lease allows 5 minutes. Each family first trains
``--probe_steps`` steps (compilation included) and its median ms/step sets how many steps fit
``--budget_s`` seconds; it is validated ``--validations`` times and the best validated checkpoint
is the one evaluated (as every run of the project selects). The table says where each stopped.

Arithmetic for one H200 (docs/performance.md, "On one H200"; an estimate, not yet measured): the
rank-4 bf16 train step at full width runs about 3,700 windows/s, so its 40 s budget is about 4
epochs of the 36,040 training stories; the free-running baseline decodes S(T) token by token in its
step (the paper: 18.8× the rank-4 model's wall time), about 200 windows/s, a fifth of an epoch in
the same 40 s. Its evaluation decodes too: about 8 s per validation (4,522 windows at an estimated
600 windows/s), 7 s for the test split and 50 s for Story Cloze (1,571 stories × 2 endings × (1 + 8
lent contexts)). With compilation (15–20 s per program, about 6 programs a family), the data
(about 10 s) and the rank-4 model's own evaluation (about 15 s), the command takes about 5 minutes:
run it with ``timeout_s=420`` and lower ``--budget_s`` or ``--validations`` if a first try shows the
estimate short.
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA_DIRS = (os.path.join(REPO, ".device_run", "data"), os.path.join(REPO, "..", "shared", "data"))
ROCSTORIES, CLOZE = "rocstories_spring2016_first45000.csv", "storycloze_val_2016.csv"
TINY_MODEL = dict(n_tokens=8, n_slices=4, dx=4, dt=2, n_heads=2, n_layers=1)  # tests/helpers.tiny_config's


def paper_config(data_dir: str | None, tiny: bool):
    """The rank-4 run config: the paper's model and optimiser (``configs/rocstories_paper.py``) on the
    ladder's data (``configs/rocstories.py``: the 45,000 ROCStories, 80/10/10 by story hash, its word
    vocabulary), bf16 compute, full-width batches (one train-step shape: one compilation)."""
    from configs import default, rocstories, rocstories_paper

    paper = rocstories_paper.get_config()
    config = default.get_config() if tiny else rocstories.get_config()
    if tiny:
        config.data.builtin_stories, config.batch_size, config.eval_batch_size = 200, 8, 16
        config.model.update(TINY_MODEL)
    else:
        config.data.path = os.path.join(data_dir, ROCSTORIES)
        config.model.update({k: paper.model[k] for k in ("n_tokens", "n_slices", "dx", "dt", "n_heads", "n_layers")})
        config.batch_size = paper.batch_size
    config.model.dropout = paper.model.dropout
    config.optim.update({k: paper.optim[k] for k in ("learning_rate", "weight_decay", "warmup_steps")})
    config.compute_dtype, config.batch_layout, config.compact_buckets = "bfloat16", "full", 0
    config.progress_bar, config.plots, config.keep_checkpoints, config.early_stop_patience = False, False, 1, 0
    return config


def budgeted(name: str, config, workdir: str, args) -> tuple[object, dict]:
    """Train ``--probe_steps`` steps, then as many more as the median ms/step fits into ``--budget_s``;
    returns the run's final config and {probe_steps, ms_per_step, steps}."""
    from rank4jax.experiments.runner import train_stage
    from rank4jax.training.metrics import steady_ms_per_step

    run_dir = os.path.join(workdir, name)
    probe = copy.deepcopy(config)
    probe.num_steps = probe.eval_every = probe.checkpoint_every = args.probe_steps
    probe.log_every = max(1, args.probe_steps // 5)
    train_stage(name, probe, run_dir)
    ms = steady_ms_per_step(run_dir, config.batch_size)
    interval = max(args.probe_steps, int(args.budget_s * 1000 / ms / args.validations))
    final = copy.deepcopy(probe)
    final.num_steps = args.probe_steps + interval * args.validations
    final.eval_every = final.checkpoint_every = final.log_every = interval
    return final, {"probe_steps": args.probe_steps, "ms_per_step_probe": ms, "steps": final.num_steps}


def report(result: dict, plan: dict, args, seconds: dict) -> str:
    import jax

    device = jax.devices()[0]
    lines = [
        "# The paper's comparison at the paper's size (bench.paper_comparison)",
        "",
        f"`python -m bench.paper_comparison {' '.join(args.argv)}` — {time.strftime('%Y-%m-%d %H:%M UTC')}",
        f"device {device.device_kind}; Python {platform.python_version()}, JAX {jax.__version__}",
        f"each family trained for --budget_s={args.budget_s:g} s of wall time after a {args.probe_steps}-step probe "
        f"(not to its validation optimum), validated {args.validations} times, the best validated checkpoint "
        "evaluated",
        "",
        "| family | probe ms/step | steps trained |",
        "|---|---|---|",
        *(f"| {name} | {p['ms_per_step_probe']:.1f} | {p['steps']} |" for name, p in plan.items()),
        "",
        "wall time: " + ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items()),
        "",
        result["table"],
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    from rank4jax.cli import run_experiment

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="the same code at a tiny size on the built-in corpus")
    ap.add_argument("--out", default="runs/paper_comparison", help="where the report goes ($OUT on the device)")
    ap.add_argument(
        "--workdir",
        default=None,
        help="the runs (checkpoints: GBs at paper size; rerun to resume); default runs/paper_comparison_runs[_tiny]",
    )
    ap.add_argument("--data_dir", default=None, help=f"holds {ROCSTORIES} and {CLOZE}")
    ap.add_argument("--budget_s", type=float, default=None, help="training seconds per family (40; tiny 2)")
    ap.add_argument("--probe_steps", type=int, default=None, help="steps that time a family (100; tiny 4)")
    ap.add_argument("--validations", type=int, default=3, help="validated checkpoints per family after the probe")
    ap.add_argument("--cloze_contexts", type=int, default=8, help="K lent contexts of the PMI and ending-only rules")
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.budget_s = args.budget_s if args.budget_s is not None else (2.0 if args.tiny else 40.0)
    args.probe_steps = args.probe_steps if args.probe_steps is not None else (4 if args.tiny else 100)
    return run_experiment("the paper comparison", lambda: run(check_args(args)))


def check_args(args):
    """One ConfigError for the first bad flag, before anything runs."""
    import math

    from rank4jax.errors import ConfigError
    from rank4jax.evaluation.report import check_count

    for name in ("probe_steps", "validations"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name} must be a positive integer, got {getattr(args, name)}")
    check_count("--cloze_contexts", args.cloze_contexts)
    if not (math.isfinite(args.budget_s) and args.budget_s > 0):
        raise ConfigError(f"--budget_s must be a positive number of seconds, got {args.budget_s:g}")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise ConfigError(f"--out={args.out} is a file, not a directory")
    args.workdir = args.workdir or ("runs/paper_comparison_runs" + ("_tiny" if args.tiny else ""))  # the user's
    return args


def run(args) -> dict:
    from rank4jax import files
    from rank4jax.engine.data_setup import prepare_data
    from rank4jax.errors import DataError
    from rank4jax.experiments import ladder as lad

    clock, seconds = time.perf_counter(), {}
    data_dir = args.data_dir or next((d for d in DATA_DIRS if os.path.isfile(os.path.join(d, ROCSTORIES))), None)
    if not args.tiny and data_dir is None:
        raise DataError(f"{ROCSTORIES} not found in {' or '.join(DATA_DIRS)}: run bench/prepare_device.sh first")
    cloze = None if args.tiny else os.path.join(data_dir, CLOZE)
    workdir = args.workdir
    rank4 = paper_config(data_dir, args.tiny)
    vocab = prepare_data(rank4, None).tokenizer.vocab_size
    width = rank4.model.dx * rank4.model.dt
    configs = {f"d{width}/rank4": rank4, f"d{width}/baseline": lad.matched_config(rank4, "baseline", vocab)}
    seconds["data"] = time.perf_counter() - clock
    rungs, plan = {}, {}
    for name, config in configs.items():
        start = time.perf_counter()
        rungs[name], plan[name] = budgeted(name, config, workdir, args)
        seconds[f"probe {name}"] = time.perf_counter() - start
    start = time.perf_counter()
    result = lad.evaluator("test", cloze, args.cloze_contexts, config=rank4)(workdir, rungs)  # trains the rest
    seconds["train and evaluate"] = time.perf_counter() - start
    seconds["total"] = time.perf_counter() - clock
    text = report(result, plan, args, seconds)
    files.write_text(args.out, "paper_comparison.md", text)
    everything = {"plan": plan, "seconds": seconds, "result": result}
    files.write_json(args.out, "paper_comparison.json", everything, default=str)
    print(text)
    return everything


if __name__ == "__main__":
    main()
