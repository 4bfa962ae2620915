"""The ZPX seed's experiment plan (seed 001 §15): standard vs angle-only vs angle+sphere vs
angle+sphere+centre regulariser, for the rank-4 model and the 1-D baseline, on the same windows.

Each run is an ordinary resumable run under ``workdir/<family>_<variant>``; the table gives the
reported split's LS(T), the lowest validation LS(T) logged, parameters and wall time per step.
"""

from __future__ import annotations

import copy

import ml_collections

from rank4jax.training.experiment import run_all, write_outputs

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
    configs = {
        f"{label}_{variant.replace('+', '_')}": (label, variant, variant_config(base, variant, center_weight))
        for label, base in bases.items()
        for variant in VARIANTS
    }
    runs = run_all({name: config for name, (_, _, config) in configs.items()}, workdir, split=split)
    rows = [
        {
            "family": label,
            "variant": variant,
            "ls": runs[name].report["last_slice_ce"],
            "best_val_ls": runs[name].best_val_ls,
            "params": runs[name].summary["parameters"],
            "ms_per_step": runs[name].ms_per_step,
            "wall_s": runs[name].summary["wall_time_total_s"],
            "steps": runs[name].summary["step"],
        }
        for name, (label, variant, _) in configs.items()
    ]
    result = {"split": split, "center_weight": center_weight, "rows": rows, "table": table_markdown(rows, split)}
    write_outputs(workdir, "zpx_plan", result, result["table"])
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
