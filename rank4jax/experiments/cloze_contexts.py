"""How many lent contexts K the PMI and ending-only Story Cloze rules need (issue 26).

Both rules estimate an ending's prior p(e) by the mean of p(e | c_k) over the contexts of K other
stories (``evaluation.evaluators``). Which K stories lend them is a random choice; this measures how
much the two rules' accuracies move with that choice. Every story's endings are scored once after a
pool of P other stories' contexts; then, for each K, K of the P lenders are drawn ``draws`` times and
each draw's accuracies computed. Draws from a finite pool overlap, which narrows the spread by
about sqrt((P − K)/(P − 1)) (the finite-population correction, reported beside each K).
"""

from __future__ import annotations

import numpy as np

from rank4jax.data.windows import cloze_windows
from rank4jax.evaluation.evaluators import cloze_scores, ending_priors, lent_context_scores, other_contexts
from rank4jax.evaluation.report import restore_for_evaluation
from rank4jax.training.data_setup import prepare_split


def context_spread(
    workdir: str,
    cloze_data: str,
    *,
    step: str | int = "best",
    pool: int = 128,
    ks: tuple[int, ...] = (8, 32, 64),
    draws: int = 200,
    seed: int = 0,
) -> dict:
    """For each K in ``ks``: the mean, standard deviation, minimum and maximum over ``draws`` draws
    of K lenders (from a pool of ``pool``) of the PMI and ending-only accuracies on ``cloze_data``."""
    run, params, evaluators = restore_for_evaluation(workdir, step)
    stories = prepare_split(run.config, run.tokenizer, "all", path=cloze_data)[0]
    pairs, labels = cloze_windows(stories, run.tokenizer, run.model_cfg.n_tokens, run.model_cfg.n_slices)
    score, batch, w = evaluators.programs.score, evaluators.batch_size, len(pairs)
    ce = cloze_scores(score, params, pairs, batch, n_contexts=0)["mean_ce"]  # (W, 2) after their own story
    other = lent_context_scores(score, params, pairs, other_contexts(w, pool, seed), batch)  # (P, W, 2)
    pool = len(other)
    rng = np.random.default_rng(seed + 1)
    by_k = {}
    for k in ks:
        accuracies = {"pmi": [], "ending_only": []}
        for _ in range(draws):
            scores = ending_priors(pairs, ce, other[rng.choice(pool, size=min(k, pool), replace=False)])
            accuracies["pmi"].append(np.mean(np.argmax(scores["pmi"], axis=1) == labels))
            accuracies["ending_only"].append(np.mean(np.argmax(scores["prior"], axis=1) == labels))
        by_k[k] = {rule: _spread(values) for rule, values in accuracies.items()}
        by_k[k]["finite_pool_factor"] = float(np.sqrt(max(pool - k, 0) / (pool - 1)))
    mean_ce = float(np.mean(np.argmin(ce, axis=1) == labels))
    return {
        "workdir": workdir,
        "step": run.step,
        "stories": w,
        "pool": pool,
        "draws": draws,
        "mean_ce": mean_ce,
        "by_k": by_k,
    }


def _spread(values) -> dict:
    values = np.asarray(values)
    return {
        "mean": float(values.mean()),
        "std": float(values.std(ddof=1)),
        "min": float(values.min()),
        "max": float(values.max()),
    }


def spread_markdown(result: dict) -> str:
    """The table: one row per K, the two rules' mean ± standard deviation and range."""
    rows = [
        f"| {k} | {r['pmi']['mean']:.4f} ± {r['pmi']['std']:.4f} | {r['pmi']['min']:.4f}–{r['pmi']['max']:.4f} "
        f"| {r['ending_only']['mean']:.4f} ± {r['ending_only']['std']:.4f} "
        f"| {r['ending_only']['min']:.4f}–{r['ending_only']['max']:.4f} | {r['finite_pool_factor']:.2f} |"
        for k, r in result["by_k"].items()
    ]
    head = (
        f"{result['workdir']} step {result['step']}: {result['stories']} stories, {result['draws']} draws of K "
        f"lenders from a pool of {result['pool']} (mean-CE rule: {result['mean_ce']:.4f})\n\n"
        "| K | PMI mean ± sd | PMI range | ending-only mean ± sd | ending-only range | pool factor |\n"
        "|---|---|---|---|---|---|"
    )
    return "\n".join([head, *rows])
