"""The SPLM report (seed 004's model card, at this machine's scale): SPLM-MLP, SPLM-Gaussian and the
matched causal-attention token LM trained on the same token streams, with validation perplexity,
parameters, time per step, the V_θ landscape statistics over validation batches and the learned α.

Matching: the SPLM-MLP's hidden width and the attention model's depth are chosen (by parameter
count from ``jax.eval_shape``) to come closest to the SPLM-Gaussian's count, as on the card.
"""

from __future__ import annotations

import copy
import functools
import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from rank4jax.data.pipeline import eval_batches
from rank4jax.engine.data_setup import prepare_data
from rank4jax.engine.run_config import model_section
from rank4jax.experiments.runner import run_all, write_outputs
from rank4jax.models import splm, stream
from rank4jax.models.family import run_param_count
from rank4jax.models.sizes import closest
from rank4jax.runs import load_run

ATTENTION_HEADS = 2  # the matched attention LM's heads (the SPLM has none); its depth is matched
CARD = {"attention": 7.81, "splm_mlp": 9.70, "splm_gaussian": 16.33}  # TinyStories validation PPL


def matched_configs(base: ml_collections.ConfigDict, vocab_size: int) -> dict:
    """{"splm_gaussian", "splm_mlp", "attention"} run configs, sized to the Gaussian's parameter count."""
    gaussian = copy.deepcopy(base)
    gaussian.model_family, gaussian.model.splm.potential = "splm", "gaussian"
    target = run_param_count(gaussian, vocab_size)
    mlp = copy.deepcopy(gaussian)
    mlp.model.splm.potential = "mlp"

    def with_hidden(width):
        mlp.model.splm.mlp_hidden = width
        return run_param_count(mlp, vocab_size)

    mlp.model.splm.mlp_hidden = closest(range(8, 4097, 8), with_hidden, target)
    attention = copy.deepcopy(gaussian)
    attention.model_family = "baseline_lm"
    attention.model = model_section("baseline_lm", gaussian.model, n_heads=ATTENTION_HEADS, dropout=0.0)

    def with_layers(layers):
        attention.model.n_layers = layers
        return run_param_count(attention, vocab_size)

    attention.model.n_layers = closest(range(1, 33), with_layers, target)
    return {"attention": attention, "splm_mlp": mlp, "splm_gaussian": gaussian}


@functools.partial(jax.jit, static_argnames="cfg")  # the parameters an argument, not baked-in constants
def _potential_values(params, windows, cfg):
    """V_θ at every position of ``windows`` as a stream, and where a real token stands."""
    packed = stream.pack_stream(windows)
    _, v = splm.forward(params, packed["inputs"], cfg)
    return v, packed["inputs"] != 0


def landscape(workdir: str, windows: np.ndarray, batch_size: int = 64) -> dict:
    """V_θ(ξ(h_L), h_L) over the real positions of ``windows`` (mean, std, min, max) and the learned α."""
    run = load_run(workdir)
    cfg = run.model_cfg
    params = jax.tree_util.tree_map(jnp.asarray, run.params)
    chunks = []
    for batch in eval_batches({"w": windows}, batch_size):
        v, real = jax.device_get(_potential_values(params, jnp.asarray(batch["w"]), cfg))
        chunks.append(v[batch["mask"]][real[batch["mask"]]])
    v = np.concatenate(chunks)
    return {
        "v_mean": float(v.mean()),
        "v_std": float(v.std()),
        "v_min": float(v.min()),
        "v_max": float(v.max()),
        "alpha": [round(float(a), 3) for a in np.asarray(splm.alphas(params))],
    }


def run_report(base: ml_collections.ConfigDict, workdir: str, label: str) -> dict:
    data = prepare_data(base, None)
    configs = matched_configs(base, data.tokenizer.vocab_size)
    # windows only: the table reads no rollout, and the stream families' greedy rollout recomputes the
    # stream once per token (about 15 minutes per model on the ROCStories validation split)
    runs = run_all(configs, workdir, split="validation", rollout_steps=0)
    rows = []
    for name, run in runs.items():
        row = {
            "corpus": label,
            "model": name,
            "ppl": math.exp(run.report["window_ce"]),
            "ls": run.report["last_slice_ce"],
            "params": run.summary["parameters"],
            "ms_per_step": run.ms_per_step,
            "training_s": run.summary["training_time_s"],
            "card_ppl": CARD[name],
        }
        if run.config.model_family == "splm":
            row |= landscape(run.run_dir, data.windows["validation"].windows, run.config.eval_batch_size)
        rows.append(row)
    write_outputs(workdir, "splm_report", rows, "")
    return {"rows": rows, "table": table_markdown(rows)}


def table_markdown(rows: list) -> str:
    lines = [
        "| corpus | model | val PPL | val LS(T) | params | ms/step | card PPL | V_θ mean / std / min / max | α |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        land = f"{r['v_mean']:.3f} / {r['v_std']:.3f} / {r['v_min']:.3f} / {r['v_max']:.3f}" if "v_mean" in r else "—"
        alpha = ", ".join(f"{a:.3f}" for a in r["alpha"]) if "alpha" in r else "—"
        lines.append(
            f"| {r['corpus']} | {r['model']} | {r['ppl']:.2f} | {r['ls']:.3f} | {r['params']:,} | "
            f"{r['ms_per_step']:.1f} | {r['card_ppl']:.2f} | {land} | {alpha} |"
        )
    return "\n".join(lines)
