"""Where the small train step's time goes: a ``jax.profiler`` trace of rank4jax's compiled train step,
summed per part of the model, beside ``torch.profiler`` of the eager PyTorch peer's step.

    python -m bench.profile_step [--size small] [--windows real|synthetic] [--layout compact|trimmed|full]
    python -m bench.profile_step --peer        # the peer's step on its own synthetic windows

rank4jax: the XLA:CPU ops of 10 steps (after 5 warm-up steps) from the trace's Perfetto file, each
op assigned by its HLO metadata to the model's named scopes (attention, mlp, readout: see
``training/profiling.py``), the dropout bits (the threefry loops), the loss's softmax, or "other"
(embedding, LayerNorm outside the scopes, AdamW); and per kind of library fusion (XLA:CPU hands dots
and reductions to YNNPACK). Op times are summed over both CPU threads, so they add up to more than
the step's wall time, which is printed too. The peer: ``torch.profiler``'s self CPU time per aten op.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import re
import tempfile

import jax
import jax.numpy as jnp

import rank4jax
from bench.bench_throughput import DEFAULT_TORCH, SIZES, batch_layouts
from bench.common import compiled_train_step, real_windows, run_steps, synthetic_windows

STEPS = 10
RUNTIME = ("ThunkExecutor", "SlinkyThreadPool", "PjitFunction", "$")  # host and runtime spans, not ops


def part_of(name: str, op_name: str) -> str:
    if name.startswith("while") or any(s in op_name for s in ("while/body", "threefry", "window_keys", "split_keys")):
        return "dropout bits"
    for scope in ("readout", "mlp", "attention"):
        if scope in op_name:
            return scope
    return "loss softmax" if op_name.endswith("/exp") else "other"


def profile_rank4jax(size: str, kind: str, layout: str) -> None:
    spec = SIZES[size]
    cfg = rank4jax.Rank4Config(**{k: v for k, v in spec.items() if k != "batch"}, dropout=0.1)
    if kind == "synthetic":
        windows = synthetic_windows(spec["batch"], cfg.n_slices, cfg.n_tokens, cfg.vocab_size)
    else:
        windows = real_windows(spec["batch"], cfg.n_tokens, cfg.n_slices, cfg.vocab_size)[0]
    rows = jax.tree.map(jnp.asarray, batch_layouts(windows, 16)[layout])
    compiled, state, _, _ = compiled_train_step(cfg, rows)
    _, state = run_steps(compiled, state, rows, 5)
    with tempfile.TemporaryDirectory(prefix="rank4jax_profile_") as trace_dir:
        jax.profiler.start_trace(trace_dir, create_perfetto_trace=True)
        seconds, state = run_steps(compiled, state, rows, STEPS)
        jax.profiler.stop_trace()
        (path,) = glob.glob(f"{trace_dir}/**/perfetto_trace.json.gz", recursive=True)
        with gzip.open(path) as trace:
            events = [e for e in json.load(trace)["traceEvents"] if e.get("ph") == "X"]
    op_names = dict(re.findall(r"%([\w.\-]+) = \S+ [^\n]*?op_name=\"([^\"]+)\"", compiled.as_text()))
    parts, fusions = collections.Counter(), collections.Counter()
    for event in events:
        if event["name"].startswith(RUNTIME):
            continue
        op_name = op_names.get(event["name"], "")
        parts[part_of(event["name"], op_name)] += event["dur"] / 1000 / STEPS
        if event["name"].startswith(("ynn_fusion", "xnn_fusion")):
            fusions[op_name.split("/")[-1] or "unnamed"] += event["dur"] / 1000 / STEPS
    print(f"rank4jax {size} {kind} {layout}: {1000 * seconds / STEPS:.1f} ms per step (wall)")
    print(f"  op time per step, both threads: {sum(parts.values()):.1f} ms")
    for part, ms in parts.most_common():
        print(f"  {part:<14} {ms:6.1f} ms")
    print("  library fusions: " + ", ".join(f"{kind} {ms:.1f} ms" for kind, ms in fusions.most_common()))


def profile_peer(script: str) -> None:
    import torch

    from bench.torch_peer_windows import load_peer, peer_step

    peer = load_peer(script)
    spec = SIZES["small"]
    torch.manual_seed(0)
    n, t, batch = spec["n_tokens"], spec["n_slices"], spec["batch"]
    m = peer.Rank4(spec["vocab_size"], spec["dx"], spec["dt"], spec["n_heads"], spec["n_layers"], n, t)
    opt = torch.optim.AdamW(m.parameters(), lr=3e-4, weight_decay=0.01)
    win = torch.randint(4, spec["vocab_size"], (batch, t + 1, n), generator=torch.Generator().manual_seed(0))
    win[:, :, n - 3 :] = 0
    step = peer_step(m, opt, win)  # the peer's step, as in its script
    for _ in range(5):
        step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(STEPS):
            step()
    print(f"torch peer small synthetic, self CPU time per step (main thread), {STEPS} steps:")
    for row in sorted(prof.key_averages(), key=lambda r: r.self_cpu_time_total, reverse=True)[:12]:
        print(f"  {row.key:<40} {row.self_cpu_time_total / 1000 / STEPS:6.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="small", choices=sorted(SIZES))
    ap.add_argument("--windows", default="real", choices=("real", "synthetic"))
    ap.add_argument("--layout", default="compact", choices=("compact", "trimmed", "full"))
    ap.add_argument("--peer", action="store_true", help="profile the PyTorch peer instead")
    ap.add_argument("--torch", default=DEFAULT_TORCH, help="path of torch_rank4.py")
    args = ap.parse_args()
    if args.peer:
        profile_peer(args.torch)
    else:
        profile_rank4jax(args.size, args.windows, args.layout)


if __name__ == "__main__":
    main()
