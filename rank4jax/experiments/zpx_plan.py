"""The ZPX seed's experiment plan (seed 001 §15): standard vs angle-only vs angle+sphere vs
angle+sphere+centre regulariser, for the rank-4 model and the 1-D baseline, on the same windows.

Each run is an ordinary resumable run under ``workdir/<family>_<variant>``; the table gives the
reported split's LS(T), the lowest validation LS(T) logged, parameters and wall time per step.
With several seeds (``run_seeds``) each seed's plan lives in ``workdir/seed<s>`` and the combined
table gives each cell's LS(T) as mean ± half-range over the seeds, with every seed's value.
"""

from __future__ import annotations

import copy

import ml_collections
import numpy as np

from rank4jax.experiments.runner import run_all, write_outputs

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
            "training_s": runs[name].summary["training_time_s"],
            "steps": runs[name].summary["step"],
        }
        for name, (label, variant, _) in configs.items()
    ]
    result = {"split": split, "center_weight": center_weight, "rows": rows, "table": table_markdown(rows, split)}
    write_outputs(workdir, "zpx_plan", result, result["table"])
    return result


def table_markdown(rows: list, split: str) -> str:
    lines = [
        f"| family | score | {split} LS(T) | Δ vs standard | best val LS(T) | params | ms/step | training s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    standard = {r["family"]: r["ls"] for r in rows if r["variant"] == "standard"}
    for r in rows:
        delta = r["ls"] - standard.get(r["family"], float("nan"))
        lines.append(
            f"| {r['family']} | {r['variant']} | {r['ls']:.3f} | {delta:+.3f} | {r['best_val_ls']:.3f} | "
            f"{r['params']:,} | {r['ms_per_step']:.1f} | {r['training_s']:.0f} |"
        )
    return "\n".join(lines)


def run_seeds(bases: dict, workdir: str, seeds, **kwargs) -> dict:
    """``run_plan`` once per seed (``config.seed`` of every base) in ``workdir/seed<s>``, then the
    combined table (``combine_seeds``) in ``workdir/zpx_seeds.{md,json}``."""
    results = []
    for seed in seeds:
        seeded = {}
        for label, base in bases.items():
            seeded[label] = copy.deepcopy(base)
            seeded[label].seed = int(seed)
        results.append(run_plan(seeded, f"{workdir}/seed{seed}", **kwargs))
    combined = combine_seeds(results, [int(s) for s in seeds])
    write_outputs(workdir, "zpx_seeds", combined, combined["table"])
    return combined


def combine_seeds(results: list, seeds: list) -> dict:
    """Per (family, variant): LS(T) of every seed, its mean and half-range, the change of the mean
    against the family's standard score, parameters, median ms/step and mean run wall time."""
    cells: dict = {}
    for result in results:
        for r in result["rows"]:
            cells.setdefault((r["family"], r["variant"]), []).append(r)
    rows = []
    for (family, variant), runs in cells.items():
        ls = np.array([r["ls"] for r in runs])
        rows.append(
            {
                "family": family,
                "variant": variant,
                "ls_per_seed": [float(x) for x in ls],
                "ls_mean": float(ls.mean()),
                "ls_half_range": float((ls.max() - ls.min()) / 2) if len(ls) > 1 else None,
                "params": runs[0]["params"],
                "ms_per_step": float(np.median([r["ms_per_step"] for r in runs])),
                "training_s": float(np.mean([r["training_s"] for r in runs])),
                "steps": runs[0]["steps"],
            }
        )
    split = results[0]["split"]
    return {"split": split, "seeds": seeds, "rows": rows, "table": seeds_table_markdown(rows, split, seeds)}


def seeds_table_markdown(rows: list, split: str, seeds: list) -> str:
    per_seed = " / ".join(f"seed {s}" for s in seeds)
    lines = [
        f"| family | score | {split} LS(T) mean ± half-range | Δ mean vs standard | {per_seed} | params | steps | "
        "ms/step | training s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    standard = {r["family"]: r["ls_mean"] for r in rows if r["variant"] == "standard"}
    for r in rows:
        delta = r["ls_mean"] - standard.get(r["family"], float("nan"))
        values = " / ".join(f"{x:.3f}" for x in r["ls_per_seed"])
        spread = f"± {r['ls_half_range']:.3f}" if r["ls_half_range"] is not None else "(one seed)"
        lines.append(
            f"| {r['family']} | {r['variant']} | {r['ls_mean']:.3f} {spread} | {delta:+.3f} | "
            f"{values} | {r['params']:,} | {r['steps']} | {r['ms_per_step']:.0f} | {r['training_s']:.0f} |"
        )
    return "\n".join(lines)
