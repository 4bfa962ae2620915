"""How many lent contexts K the PMI and ending-only Story Cloze rules need.

Both rules estimate an ending's prior p(e) by the mean of p(e | c_k) over the contexts of K other
stories (``evaluation.evaluators``). Which K stories lend them is a random choice; this measures how
much the two rules' accuracies move with that choice. Every story's endings are scored once after a
pool of P other stories' contexts; then, for each K, K of the P lenders are drawn ``draws`` times and
each draw's accuracies computed. Draws from a finite pool overlap, which narrows the spread by
about sqrt((P − K)/(P − 1)) (the finite-population correction, reported beside each K).

What the PMI rule's prior does. log mean_k p(e | c_k) = mean_k log p(e | c_k) + J(e), where the
Jensen gap J(e) ≥ 0 grows with how much the ending's likelihood varies over the lent contexts; so
PMI = [log p(e | c) − mean_k log p(e | c_k)] − J(e) penalises the ending whose likelihood depends
more on its context. This also reports the rule without that penalty ("geometric": the ending with
the higher log p(e | c) − mean_k log p(e | c_k)) and, over the whole pool, how J differs between the
right and the wrong endings.
"""

from __future__ import annotations

import os

import numpy as np

from rank4jax import files
from rank4jax.data.windows import cloze_windows
from rank4jax.engine.data_setup import check_held_out, prepare_split
from rank4jax.errors import ConfigError, DataError
from rank4jax.evaluation.evaluators import (
    cloze_scores,
    ending_priors,
    lent_context_scores,
    other_contexts,
    outcomes,
)
from rank4jax.evaluation.report import restore_for_evaluation
from rank4jax.records import check_own_paths


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
    of K lenders (from a pool of ``pool``) of the PMI, ending-only and geometric accuracies on
    ``cloze_data``. ``per_story`` holds the arrays they come from, for further analysis: each ending's
    mean CE after its own story (W, 2) and after each lender's context (P, W, 2), the labels (W,) and
    the scored windows (W, 2, T+1, N)."""
    check_settings(pool, ks, draws)
    run, params, evaluators = restore_for_evaluation(workdir, step)
    stories = prepare_split(run.config, run.tokenizer, "all", path=cloze_data)[0]
    trained_on = check_held_out(run.config, stories, "all", cloze_data, warn=False)
    if trained_on:
        raise ConfigError(
            f"{trained_on:,} of the {len(stories):,} stories of {cloze_data} are stories this run trained on: "
            "their accuracies would not be held out; give a held-out Story Cloze file"
        )
    pairs, labels = cloze_windows(stories, run.tokenizer, run.model_cfg.n_tokens, run.model_cfg.n_slices)
    score, batch, w = evaluators.programs.score, evaluators.batch_size, len(pairs)
    if w < 2:
        raise DataError(f"{cloze_data} holds {w} Story Cloze stor{'y' if w == 1 else 'ies'} (a context, two endings "
                        "and the right one's number); the spread needs at least 2")  # fmt: skip
    if max(ks) > min(pool, w - 1):
        raise ConfigError(f"--ks: K={max(ks)} is more than the {min(pool, w - 1)} lenders there are "
                          f"(--pool={pool}; {cloze_data} has {w} stories, each lent to by the others)")  # fmt: skip
    ce = cloze_scores(score, params, pairs, batch, n_contexts=0)["mean_ce"]  # (W, 2) after their own story
    other = lent_context_scores(score, params, pairs, other_contexts(w, pool, seed), batch)  # (P, W, 2)
    pool = len(other)
    rng = np.random.default_rng(seed + 1)
    by_k = {}
    for k in ks:
        accuracies = {"pmi": [], "ending_only": [], "geometric": []}
        for _ in range(draws):
            scores = ending_priors(pairs, ce, other[rng.choice(pool, size=min(k, pool), replace=False)])
            for rule, score_by_rule in rule_scores(scores).items():
                accuracies[rule].append(_accuracy(score_by_rule, labels))
        by_k[k] = {rule: _spread(values) for rule, values in accuracies.items()}
        by_k[k]["finite_pool_factor"] = float(np.sqrt(max(pool - k, 0) / (pool - 1)))
    whole_pool = ending_priors(pairs, ce, other)
    return {
        "workdir": workdir,
        "step": run.step,
        "stories": w,
        "pool": pool,
        "draws": draws,
        "mean_ce": _accuracy(-ce, labels),  # the lower mean CE after its own story
        "by_k": by_k,
        "jensen_gap": jensen_gap_by_label(whole_pool, labels),
        "contrast": contrast_by_label(whole_pool, labels),
        "per_story": {"own_ce": ce, "lent_ce": other, "labels": labels, "pairs": pairs},
    }


def write_spread(workdir: str, result: dict) -> dict:
    """``eval/cloze_contexts_step<N>.npz`` (each story's figures) and ``.json`` (the rest) in the run's
    workdir, through the one writer; the result without its per-story arrays."""
    stem = os.path.join("eval", f"cloze_contexts_step{result['step']}")
    check_own_paths(workdir, ("eval", stem + ".npz", stem + ".json"))  # both refused before either is written
    files.save_npz(workdir, stem + ".npz", **result.pop("per_story"))
    files.write_json(workdir, stem + ".json", result)
    return result


def check_settings(pool: int, ks: tuple[int, ...], draws: int) -> None:
    """One ConfigError naming the first setting the spread cannot use, before anything is read."""
    if pool < 2:
        raise ConfigError(f"--pool must be at least 2 (the pool factor divides by pool − 1), got {pool}")
    if not ks or min(ks) < 1:
        raise ConfigError(f"--ks must each be at least 1, got {','.join(map(str, ks))}")
    if max(ks) > pool:
        raise ConfigError(f"--ks: K={max(ks)} is more than the pool of --pool={pool} lenders it is drawn from")
    if draws < 2:
        raise ConfigError(f"--draws must be at least 2 (the spread's standard deviation needs two), got {draws}")


def rule_scores(scores: dict) -> dict:
    """(W, 2) scores, higher wins, of the three rules that use lent contexts."""
    geometric = scores["pmi"] + scores["prior"] - scores["log_mean_prior"]  # log p(e | c) − mean_k log p(e | c_k)
    return {"pmi": scores["pmi"], "ending_only": scores["prior"], "geometric": geometric}


def jensen_gap_by_label(scores: dict, labels: np.ndarray) -> dict:
    """The Jensen gap J (W, 2) of :func:`~rank4jax.evaluation.evaluators.ending_priors`'s prior for the
    right and the wrong endings: their means, and the share of stories where the right ending's J is
    the larger (where the gap alone pushes PMI towards the wrong ending)."""
    right, wrong = _right_wrong(scores["prior"] - scores["log_mean_prior"], labels)
    return {
        "right_mean": float(right.mean()),
        "wrong_mean": float(wrong.mean()),
        "right_larger": float(np.mean(right > wrong)),
    }


def contrast_by_label(scores: dict, labels: np.ndarray) -> dict:
    """The context contrast log p(e | c) − mean_k log p(e | c_k) of ``ending_priors`` scores (the
    geometric rule), summed over the ending's tokens and per token, for the right and the wrong
    endings; the accuracy of picking the higher one per token and summed (and summed on the
    equal-length pairs); and the endings' lengths (PMI sums over tokens, so a contrast alike per
    token favours the longer ending)."""
    tokens = scores["tokens"]
    summed = rule_scores(scores)["geometric"]
    per_token = summed / np.maximum(tokens, 1)
    (right, wrong), (tokens_right, tokens_wrong) = _right_wrong(per_token, labels), _right_wrong(tokens, labels)
    same = tokens_right == tokens_wrong
    return {
        "per_token_right": float(right.mean()),
        "per_token_wrong": float(wrong.mean()),
        "per_token_accuracy": _accuracy(per_token, labels),
        "summed_accuracy": _accuracy(summed, labels),
        "summed_accuracy_equal_length": _accuracy(summed[same], labels[same]) if same.any() else float("nan"),
        "equal_length_pairs": int(same.sum()),
        "tokens_right": float(tokens_right.mean()),
        "tokens_wrong": float(tokens_wrong.mean()),
        "right_longer": float(np.mean(tokens_right > tokens_wrong)),
        "right_shorter": float(np.mean(tokens_right < tokens_wrong)),
    }


def _right_wrong(values: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """values (W, 2) → each story's value for its right ending and for its wrong one, (W,) each."""
    rows = np.arange(len(labels))
    return values[rows, labels], values[rows, 1 - labels]


def _accuracy(scores: np.ndarray, labels: np.ndarray) -> float:
    """The share of stories whose higher-scoring ending (scores (W, 2)) is the right one, a tie half."""
    return float(np.mean(outcomes(scores, labels)))


def _spread(values) -> dict:
    values = np.asarray(values)
    return {
        "mean": float(values.mean()),
        "std": float(values.std(ddof=1)),
        "min": float(values.min()),
        "max": float(values.max()),
    }


def spread_markdown(result: dict) -> str:
    """The table: one row per K, each rule's mean ± standard deviation and range; the Jensen gap below."""
    rules = ("pmi", "ending_only", "geometric")
    rows = [
        f"| {k} | "
        + " | ".join(f"{r[x]['mean']:.4f} ± {r[x]['std']:.4f} | {r[x]['min']:.4f}–{r[x]['max']:.4f}" for x in rules)
        + f" | {r['finite_pool_factor']:.2f} |"
        for k, r in result["by_k"].items()
    ]
    head = (
        f"{result['workdir']} step {result['step']}: {result['stories']} stories, {result['draws']} draws of K "
        f"lenders from a pool of {result['pool']} (mean-CE rule: {result['mean_ce']:.4f})\n\n"
        "| K | PMI mean ± sd | PMI range | ending-only mean ± sd | ending-only range "
        "| geometric mean ± sd | geometric range | pool factor |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    gap = result["jensen_gap"]
    foot = (
        f"\nJensen gap of the PMI prior over the whole pool: right endings {gap['right_mean']:.4f}, wrong "
        f"{gap['wrong_mean']:.4f} nats on average; the right ending's is the larger in {gap['right_larger']:.4f} "
        "of the stories."
    )
    c = result["contrast"]
    foot += (
        f"\nContext contrast log p(e | c) − mean_k log p(e | c_k) over the pool, per token: right endings "
        f"{c['per_token_right']:.4f}, wrong {c['per_token_wrong']:.4f} nats; picking the higher per token "
        f"{c['per_token_accuracy']:.4f}, summed {c['summed_accuracy']:.4f} ({c['summed_accuracy_equal_length']:.4f} on "
        f"the {c['equal_length_pairs']} equal-length pairs); tokens right {c['tokens_right']:.2f}, wrong "
        f"{c['tokens_wrong']:.2f}; the right ending the longer in {c['right_longer']:.4f} of the stories, the "
        f"shorter in {c['right_shorter']:.4f}."
    )
    return "\n".join([head, *rows, foot])
