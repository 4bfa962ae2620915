"""rank4jax train and eval step throughput against the eager PyTorch peer, side by side.

    python -m bench.bench_throughput [--pairs 5] [--sizes small,medium] [--windows synthetic,real]
    python -m bench.bench_throughput --sizes paper --dtypes float32,bfloat16 --torch ''   # on a GPU

Sizes: small (dx=16, dt=8, H=2, L=2, V=4000, N=16, T=4, B=32), medium (dx=32, dt=16, B=16) and
paper (dx=64, dt=32, H=4, L=2, V=36,711, B=32). Windows: ``synthetic`` are the PyTorch script's
(random tokens, the last 3 positions of every state PAD); ``real`` are Story Cloze sentences
(``../shared/data``; the built-in corpus when absent) at the same N and T, where many more
positions are PAD.

For each size, window kind and compute dtype it reports the rank4jax train step on three layouts
of the same windows — full width N, cut to the used width N' (``trim_padding``) and the compact
batch (``compact_windows``: only positions whose input or target is not PAD); training runs the
fastest (``batch_layout="auto"``) — and the forward-only eval step on trimmed and compact rows
(against the peer's eval-mode forward and loss on the same windows, ``torch_peer_windows.py
--forward``): windows/s, tokens/s (N·T positions per window), model FLOPs per window counted
analytically at full width, achieved GFLOP/s (full-width FLOPs, so a layout that
skips work shows above the arithmetic it does) and its ratio to this machine's matmul peak in that
dtype (measured in the same run), compile time and compiled peak memory.

It then runs the PyTorch peer and the rank4jax steps alternately, ``--pairs`` times, and prints the
ratios of the medians. On synthetic windows the peer is ``torch_rank4.py`` itself; on real windows it
is the same model class and step on the same windows (``bench/torch_peer_windows.py``). Before
timing, the same parameters are loaded into the PyTorch model and both losses are computed on the
same windows in eval mode (float32) for every layout, so "the same numerics" is checked, not assumed.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

import rank4jax
from bench.common import compiled_train_step, peak_bytes, real_windows, run_steps, step_timer, synthetic_windows
from rank4jax.data.compact import compact_size, compact_windows
from rank4jax.data.windows import trim_padding
from rank4jax.models.family import RANK4
from rank4jax.models.flops import rank4_forward as forward_flops_per_window  # the count training logs
from rank4jax.models.precision import cast_to_compute

SMALL = dict(dx=16, dt=8, n_heads=2, n_layers=2, vocab_size=4000, n_tokens=16, n_slices=4, batch=32)
SIZES = {
    "small": SMALL,
    "medium": {**SMALL, "dx": 32, "dt": 16, "batch": 16},
    "paper": {**SMALL, "dx": 64, "dt": 32, "n_heads": 4, "vocab_size": 36_711, "batch": 32},
}
DEFAULT_TORCH = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "bench", "torch_rank4.py")
PEER_ON_WINDOWS = os.path.join(os.path.dirname(__file__), "torch_peer_windows.py")


def matmul_peak_gflops(dtype, n: int | None = None, chain: int = 8, repeats: int = 5) -> float:
    """Best-of-``repeats`` rate of ``chain`` dependent n×n matmuls in one jitted call (n = 2048 on CPU,
    8192 on accelerators, where one small matmul would time the launch, not the arithmetic)."""
    n = n or (2048 if jax.devices()[0].platform == "cpu" else 8192)
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(dtype) / np.sqrt(n)

    @jax.jit
    def f(x):
        for _ in range(chain):
            x = x @ a
        return x

    f(a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        f(a).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return chain * 2 * n**3 / best / 1e9


def compiled_eval_step(cfg, params, rows):
    """(the eval step's loss sums compiled for ``rows`` of a layout, the rows on the device, compile s)."""
    rows = jax.tree.map(jnp.asarray, rows)
    start = time.perf_counter()
    compiled = jax.jit(functools.partial(RANK4.loss_sums, cfg=cfg)).lower(params, rows).compile()
    compile_s = time.perf_counter() - start
    jax.block_until_ready(compiled(params, rows))
    return compiled, rows, compile_s


def eval_seconds(compiled, params, windows, steps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(steps):
        out = compiled(params, windows)
    jax.block_until_ready(out)
    return (time.perf_counter() - t0) / steps


MODEL_FLAGS = dict(dx="dx", dt="dt", H="n_heads", L="n_layers", V="vocab_size")  # the peer's flag → size key
SHAPE_FLAGS = dict(N="n_tokens", T="n_slices", B="batch")


def torch_args(spec: dict, flags: dict) -> list[str]:
    return [arg for flag, key in flags.items() for arg in (f"--{flag}", str(spec[key]))]


def torch_windows_per_s(
    script: str, spec: dict, steps: int, windows_file: str | None = None, device: str = "cpu", forward: bool = False
) -> float:
    """The peer's windows/s: its own script on its own windows, or its step (``forward``: its eval-mode
    forward and loss) on ``windows_file``."""
    if forward:
        dims = torch_args(spec, MODEL_FLAGS)
        args = [sys.executable, PEER_ON_WINDOWS, script, windows_file, *dims, "--steps", str(steps), "--forward"]
    elif windows_file is None and device == "cpu":
        args = [sys.executable, script, *torch_args(spec, MODEL_FLAGS | SHAPE_FLAGS), "--steps", str(steps)]
    else:  # N, T, B: the windows file's shape
        dims = torch_args(spec, MODEL_FLAGS)
        args = [sys.executable, PEER_ON_WINDOWS, script, windows_file, *dims, "--steps", str(steps), "--device", device]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return float(re.search(r"torch_windows_per_s=([0-9.]+)", out).group(1))


def torch_loss(script: str, cfg: rank4jax.Rank4Config, params: dict, windows: np.ndarray) -> float:
    """The PyTorch model's eval-mode loss with rank4jax's parameters on ``windows``."""
    import torch

    spec = importlib.util.spec_from_file_location("torch_rank4", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.Rank4(cfg.vocab_size, cfg.dx, cfg.dt, cfg.n_heads, cfg.n_layers, cfg.n_tokens, cfg.n_slices)
    p = jax.tree_util.tree_map(lambda leaf: torch.from_numpy(np.array(leaf, np.float32)), params)
    with torch.no_grad():
        model.esem.weight.copy_(p["embed"]["sem"])
        model.etmp.weight.copy_(p["embed"]["tmp"])
        model.wprime.copy_(p["readout"]["tmp"])
        for i, layer in enumerate(p["layers"]):
            for ln, name in ((model.ln_a[i], "ln_attn"), (model.ln_m[i], "ln_mlp")):
                ln.weight.copy_(layer[name]["scale"].reshape(-1))
                ln.bias.copy_(layer[name]["bias"].reshape(-1))
            model.wqkv[i].copy_(torch.stack([layer["attn"][k] for k in ("wq", "wk", "wv")]))
            model.mlp[i][0].weight.copy_(layer["mlp"]["w1"].T)
            model.mlp[i][0].bias.copy_(layer["mlp"]["b1"])
            model.mlp[i][2].weight.copy_(layer["mlp"]["w2"].T)
            model.mlp[i][2].bias.copy_(layer["mlp"]["b2"])
        model.ln_f.weight.copy_(p["final_ln"]["scale"].reshape(-1))
        model.ln_f.bias.copy_(p["final_ln"]["bias"].reshape(-1))
        model.eval()
        win = torch.from_numpy(windows.astype(np.int64))
        logits = model(win[:, :-1])
        tgt = win[:, 1:].transpose(1, 2)
        ref = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab_size), tgt.reshape(-1), ignore_index=0)
    return float(ref)


def report(label: str, batch: int, positions: int, seconds: float, flops: int, peak: float, compile_s, memory):
    gflops = batch * flops / seconds / 1e9
    print(
        f"{label:<36} {batch / seconds:9.1f} windows/s {batch * positions / seconds:10.0f} tokens/s "
        f"{flops / 1e6:9.1f} MFLOP/window {gflops:8.1f} GFLOP/s ({gflops / peak:.2f} of peak) "
        f"compile {compile_s:5.2f} s  peak memory {memory / 2**20:8.1f} MiB"
    )


def batch_layouts(windows: np.ndarray, buckets: int) -> dict:
    """The train step's inputs: full width, cut to the used width, and the compact batch (training's)."""
    return {"full": windows, "trimmed": trim_padding(windows), "compact": compact_windows(windows, buckets=buckets)}


def layout_label(name: str, batch, cfg) -> str:
    if name == "full":
        return f"N={cfg.n_tokens}"
    if name == "trimmed":
        return f"N'={batch.shape[2]}"
    rows, target_rows = compact_size(batch)
    return f"compact R={rows} Rt={target_rows}"


def bench_size(size: str, spec: dict, dtype, args, peak: float, kind: str) -> None:
    model = {k: v for k, v in spec.items() if k != "batch"}
    cfg = rank4jax.Rank4Config(**model, dropout=0.1)
    batch, positions = spec["batch"], cfg.n_tokens * cfg.n_slices
    if kind == "synthetic":
        windows, source = synthetic_windows(batch, cfg.n_slices, cfg.n_tokens, cfg.vocab_size), "peer's random"
    elif args.real_windows:
        windows, source = np.load(args.real_windows)[:batch], args.real_windows
    else:
        windows, source = real_windows(batch, cfg.n_tokens, cfg.n_slices, cfg.vocab_size)
    layouts = batch_layouts(windows, args.buckets)
    fwd = forward_flops_per_window(cfg)
    tag = f"{size} {jnp.dtype(dtype).name} {kind}"
    print(f"{tag}: {source} windows, {np.mean(windows[:, 1:] != 0):.0%} of target positions real")
    runs = {}
    for name, rows in layouts.items():
        rows = jax.tree.map(jnp.asarray, rows)
        compiled, state, compile_s, memory = compiled_train_step(cfg, rows, compute_dtype=dtype)
        runs[name] = {"step": compiled, "state": run_steps(compiled, state, rows, 2)[1], "batch": rows}
        runs[name]["figures"] = (compile_s, peak_bytes(memory))
    params = jax.tree_util.tree_map(jnp.copy, runs["compact"]["state"].params)  # the train step donates its state
    computed = cast_to_compute(params, jnp.dtype(dtype).name)  # the eval step in the run's compute dtype
    evals = {name: compiled_eval_step(cfg, computed, layouts[name]) for name in ("trimmed", "compact")}
    peer = args.torch and dtype == jnp.float32
    windows_file, forward_file = torch_peer_files(tag, cfg, params, windows, runs, kind, args) if peer else (None, None)
    timers = {name: step_timer(run, args.steps) for name, run in runs.items()}
    times = {name: [] for name in runs}
    torch_rates, torch_forward_rates, eval_times = [], [], {name: [] for name in evals}
    for _ in range(args.pairs):
        for name, timer in timers.items():
            times[name].append(timer())
        for name, (compiled, rows, _) in evals.items():
            eval_times[name].append(eval_seconds(compiled, computed, rows, args.steps))
        if peer:
            torch_rates.append(torch_windows_per_s(args.torch, spec, args.steps, windows_file, args.torch_device))
            if args.torch_device == "cpu":
                torch_forward_rates.append(
                    torch_windows_per_s(args.torch, spec, args.steps, forward_file, forward=True)
                )
    eval_s = {name: statistics.median(values) for name, values in eval_times.items()}
    for name, run in runs.items():
        seconds = statistics.median(times[name])
        label = f"{tag} train {layout_label(name, layouts[name], cfg)}"
        report(label, batch, positions, seconds, 3 * fwd, peak, *run["figures"])
    for name, (compiled, _, compile_s) in evals.items():
        figures = (compile_s, peak_bytes(compiled.memory_analysis()))
        report(
            f"{tag} eval {layout_label(name, layouts[name], cfg)}", batch, positions, eval_s[name], fwd, peak, *figures
        )
    print_ratios(tag, batch, times, eval_s, torch_rates, torch_forward_rates)


def torch_peer_files(tag: str, cfg, params: dict, windows: np.ndarray, runs: dict, kind: str, args) -> tuple:
    """Checks the peer's loss against each layout's on the same windows and parameters, and saves the
    windows for it: (its step's windows file, or None for its own synthetic ones; its forward's file)."""
    ref = torch_loss(args.torch, cfg, params, windows)
    gaps = {n: abs(float(RANK4.loss_sums(params, r["batch"], cfg)["objective"]) - ref) for n, r in runs.items()}
    print(
        f"{tag:<36} same windows and parameters, eval mode: torch loss {ref:.6f}; |rank4jax - torch| = "
        + ", ".join(f"{gap:.2e} ({name})" for name, gap in gaps.items())
    )
    forward_file = os.path.join(args.scratch, "windows.npy")  # main's temporary directory
    np.save(forward_file, windows)  # the peer's forward always runs on the saved windows
    return (forward_file if kind != "synthetic" or args.torch_device != "cpu" else None), forward_file


def print_ratios(tag: str, batch: int, times: dict, eval_s: dict, torch_rates: list, forward_rates: list) -> None:
    """rank4jax / torch of the train step (the fastest layout: what training keeps) and of the eval step."""
    if torch_rates:
        torch_median = statistics.median(torch_rates)
        ratios = {name: batch / statistics.median(times[name]) / torch_median for name in times}
        fastest = max(ratios, key=ratios.get)  # what batch_layout="auto" keeps (training.layout_choice)
        print(
            f"{tag:<36} torch {torch_median:9.1f} windows/s (median of {len(torch_rates)}); rank4jax / torch = "
            f"{ratios[fastest]:.2f} as trained ({fastest}, the fastest layout); compact {ratios['compact']:.2f}, "
            f"trimmed {ratios['trimmed']:.2f}, full width {ratios['full']:.2f}"
        )
    if forward_rates:
        forward_median = statistics.median(forward_rates)
        ratios = {name: batch / seconds / forward_median for name, seconds in eval_s.items()}
        print(
            f"{tag:<36} torch forward {forward_median:9.1f} windows/s (eval mode, median of "
            f"{len(forward_rates)}); rank4jax eval step / torch forward = "
            + ", ".join(f"{ratio:.2f} ({name})" for name, ratio in ratios.items())
        )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--sizes", default="small,medium", help=f"comma-separated, from {sorted(SIZES)}")
    ap.add_argument("--dtypes", default="float32", help="compute dtypes (config.compute_dtype), comma-separated")
    ap.add_argument(
        "--windows",
        default="synthetic,real",
        help="synthetic (the peer's random tokens, last 3 positions PAD) and/or real (Story Cloze sentences "
        "from ../shared/data when present, else the built-in corpus)",
    )
    ap.add_argument("--buckets", type=int, default=16, help="compact_buckets of the compact layout")
    ap.add_argument("--real-windows", default="", help="a .npy of real (W, T+1, N) windows to use instead")
    ap.add_argument("--torch-device", default="cpu", help="where the peer runs: cpu (its own script) or cuda")
    ap.add_argument("--torch", default=DEFAULT_TORCH, help="path of torch_rank4.py ('' to skip)")
    args = ap.parse_args()
    if args.torch and not os.path.isfile(args.torch):
        sys.exit(f"error: {args.torch} does not exist (pass --torch '' to skip the PyTorch peer)")
    device = jax.devices()[0]
    with tempfile.TemporaryDirectory(prefix="rank4jax_bench_") as args.scratch:  # the peer's windows, removed after
        for dtype_name in args.dtypes.split(","):
            dtype = jnp.dtype(dtype_name).type
            peak = matmul_peak_gflops(dtype)
            print(
                f"{dtype_name} matmul peak (chained square matmuls, jitted): {peak:.1f} GFLOP/s "
                f"on {device.platform} {device.device_kind}"
            )
            for kind in args.windows.split(","):
                for size in args.sizes.split(","):
                    bench_size(size, SIZES[size], dtype, args, peak, kind)


if __name__ == "__main__":
    main()
