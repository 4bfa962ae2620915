"""The ZPX seed's experiment plan (seed 001 §15): standard vs angle-only vs angle+sphere vs
angle+sphere+centre regulariser, for the rank-4 model and the 1-D baseline, on the same windows.

Each run is an ordinary resumable run under ``workdir/<family>_<variant>``; the table gives the
reported split's LS(T), the lowest validation LS(T) logged, parameters and wall time per step.
"""

from __future__ import annotations

import copy
import json
import os

import ml_collections

from rank4jax.training.eval_run import evaluate_run
from rank4jax.training.loop import train
from rank4jax.training.metrics import read_metrics, steady_ms_per_step

VARIANTS = {  # name → model.zpx overrides
    "standard": {"score": "standard", "center_weight": 0.0},
    "angle": {"score": "zpx_angle", "center_weight": 0.0},
    "angle+sphere": {"score": "zpx_angle_sphere", "center_weight": 0.0},
    "angle+sphere+centre": {"score": "zpx_angle_sphere"},  # keeps the config's centre weight
}


def variant_config(base: ml_collections.ConfigDict, variant: str, center_weight: float) -> ml_collections.ConfigDict:
    config = copy.deepcopy(base)
    overrides = dict(VARIANTS[variant])
    overrides.setdefault("center_weight", center_weight)
    for key, value in overrides.items():
        config.model.zpx[key] = value
    return config


def run_plan(bases: dict, workdir: str, *, center_weight: float = 0.01, split: str = "test") -> dict:
    """``bases``: family label → run config (same data). Trains every (family, variant) run."""
    rows = []
    for label, base in bases.items():
        for variant in VARIANTS:
            config = variant_config(base, variant, center_weight)
            run_dir = os.path.join(workdir, f"{label}_{variant.replace('+', '_')}")
            summary = train(config, run_dir)
            report = evaluate_run(run_dir, split=split, num_examples=0, rollout_steps=1)
            val = read_metrics(run_dir).get("validation", [])
            rows.append(
                {
                    "family": label,
                    "variant": variant,
                    "ls": report["last_slice_ce"],
                    "best_val_ls": min((r["last_slice_ce"] for r in val), default=float("nan")),
                    "params": summary["parameters"],
                    "ms_per_step": steady_ms_per_step(run_dir, config.batch_size),
                    "wall_s": summary["wall_time_total_s"],
                    "steps": summary["step"],
                }
            )
    result = {"split": split, "center_weight": center_weight, "rows": rows, "table": table_markdown(rows, split)}
    with open(os.path.join(workdir, "zpx_plan.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    with open(os.path.join(workdir, "zpx_plan.md"), "w", encoding="utf-8") as f:
        f.write(result["table"] + "\n")
    return result


def table_markdown(rows: list, split: str) -> str:
    lines = [
        f"| family | score | {split} LS(T) | Δ vs standard | best val LS(T) | params | ms/step | run wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    standard = {r["family"]: r["ls"] for r in rows if r["variant"] == "standard"}
    for r in rows:
        delta = r["ls"] - standard.get(r["family"], float("nan"))
        lines.append(
            f"| {r['family']} | {r['variant']} | {r['ls']:.3f} | {delta:+.3f} | {r['best_val_ls']:.3f} | "
            f"{r['params']:,} | {r['ms_per_step']:.1f} | {r['wall_s']:.0f} |"
        )
    return "\n".join(lines)
