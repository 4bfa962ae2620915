"""Evaluators: window metrics over a split, Story Cloze accuracy, decoded predictions and
multi-step rollout (SPEC §4, §8). Everything runs batched: many windows or stories per jitted call.

:class:`Evaluators` is built once from a run's programs (``rank4jax.engine.programs``: its mesh,
shardings and jitted steps) and its batch layout; training's validation, ``eval.py``, the experiment
reports and the benches all evaluate through it.

Axes: W windows or stories, T input slices, N tokens per state, K other contexts.

Story Cloze, two scoring rules (the predicted ending is the better-scored candidate):

- ``cloze_accuracy``: the lower mean CE of the candidate as S(T) after the story's T sentences
  (each family's own S(T) score: the rank-4 readout at the last slice; the baseline's free-running
  decode).
- ``cloze_accuracy_normalised``: the higher pointwise mutual information of ending and story,
  ``log p(e | c) − log p(e)``, summed over the ending's tokens. ``log p(e)``, how likely the ending
  is without its story, is estimated by the same family score with the contexts of K other stories
  of the file: ``log p(e) ≈ log mean_k p(e | c_k)`` (K = ``CLOZE_CONTEXTS``, the same K contexts for
  both candidates). Neither family ever sees an empty context in training (the rank-4 joint softmax
  would have no key; the baseline is trained only on S(T) after T sentences), so the normaliser
  uses real, in-distribution contexts. The rule discounts endings that are likely anywhere (short,
  generic sentences) — the bias that a plain likelihood comparison has.

Rollout: from the window S(0..T-1) the model predicts Ŝ(T); the window then drops its oldest state
and appends Ŝ(T), and so on — from the first prediction on, ground truth never enters the window.
Where the story has a gold sentence for a rollout step, its CE under the rolled-out context is
reported.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from rank4jax import signals
from rank4jax.data.pipeline import eval_batches
from rank4jax.engine.sharding import put_batch
from rank4jax.models.losses import means_from_sums
from rank4jax.tokens import PAD_ID


def _global_batch(rows: np.ndarray, sharding) -> jax.Array:
    """Every process holds the whole eval batch; each contributes its contiguous share of rows."""
    local = len(rows) // jax.process_count()
    start = jax.process_index() * local
    return jax.make_array_from_process_local_data(sharding, rows[start : start + local])


def evaluate_windows(eval_step, params, windows: np.ndarray, batch_size: int, batch_sharding, layout=None) -> dict:
    """Exact means over every window (padding rows are all PAD and carry no tokens). ``layout``
    (``rank4jax.engine.batches.batch_layout``, single process) turns each batch into what the
    step consumes; the sums stay on the device until the pass ends (one transfer)."""
    pending = []
    for batch in eval_batches({"windows": windows}, batch_size):
        if jax.process_count() > 1:  # each process holds the whole batch (full width there)
            rows = _global_batch(batch["windows"], batch_sharding)
        else:
            rows = put_batch(batch["windows"] if layout is None else layout(batch["windows"]), batch_sharding)
        pending.append(eval_step(params, rows))
        _bound_in_flight(pending)
    totals: dict[str, float] = {}
    for sums in jax.device_get(pending):
        for key, value in sums.items():
            totals[key] = totals.get(key, 0.0) + float(value)
    means = {k: float(v) for k, v in means_from_sums(totals).items()}
    return means | {
        "window_tokens": int(totals["window_tokens"]),
        "last_slice_tokens": int(totals["last_slice_tokens"]),
    }


CLOZE_CONTEXTS = 8  # K other stories' contexts for the normalised Story Cloze rule


IN_FLIGHT = 4  # queued calls at most: XLA's CPU collectives can deadlock behind a deeper queue


def _bound_in_flight(pending: list) -> None:
    """Wait for the call ``IN_FLIGHT`` places back, so at most that many are queued on the devices."""
    if len(pending) > IN_FLIGHT:
        jax.block_until_ready(pending[-IN_FLIGHT - 1])


def batched(fn, params, array: np.ndarray, batch_size: int):
    """``fn(params, batch)`` over the rows of ``array`` in fixed-size batches (one compiled shape);
    the results are fetched once, at the end. ``fn`` may return a tuple of arrays."""
    pending, masks = [], []
    for b in eval_batches({"x": array}, batch_size):
        signals.check()  # a command's Ctrl-C stops here
        pending.append(fn(params, b["x"]))
        masks.append(b["mask"])
        _bound_in_flight(pending)
    if not pending:
        raise ValueError("batched() needs at least one row")
    fetched = jax.device_get(pending)
    parts = [jax.tree.map(lambda a, m=mask: np.asarray(a)[m], out) for out, mask in zip(fetched, masks, strict=True)]
    return jax.tree.map(lambda *a: np.concatenate(a), *parts)


def other_contexts(n_stories: int, n_contexts: int, seed: int = 0) -> np.ndarray:
    """(K, W) index of the story lending its context to story w for the k-th normaliser: distinct
    shifts in [1, W), so no story is its own normaliser and every context is used K times."""
    k = min(n_contexts, n_stories - 1)
    shifts = np.random.default_rng(seed).choice(np.arange(1, n_stories), size=k, replace=False)
    return (np.arange(n_stories)[None] + shifts[:, None]) % n_stories


def cloze_scores(
    score, params, pairs: np.ndarray, batch_size: int, n_contexts: int = CLOZE_CONTEXTS, seed: int = 0
) -> dict:
    """pairs (W, 2, T+1, N): the story's context, then each candidate ending as S(T).

    Returns ``mean_ce`` (W, 2), the first rule's score (lower wins), and, with two stories or more,
    ``pmi`` (W, 2), the second rule's (higher wins; see the module docstring), ``prior`` (W, 2), the
    third's: log mean_k p(e | c_k), the ending's likelihood without its story (higher wins),
    ``log_mean_prior`` (see :func:`ending_priors`) and ``contexts`` K. ``seed`` picks which K other
    stories lend their contexts."""
    w, shape = len(pairs), pairs.shape[2:]
    ce = batched(score, params, pairs.reshape((2 * w,) + shape), batch_size).reshape(w, 2)
    out = {"mean_ce": ce}
    if w < 2 or n_contexts < 1:
        return out
    lenders = other_contexts(w, n_contexts, seed)  # (K, W)
    other = lent_context_scores(score, params, pairs, lenders, batch_size)
    return out | ending_priors(pairs, ce, other)


def lent_context_scores(score, params, pairs: np.ndarray, lenders: np.ndarray, batch_size: int) -> np.ndarray:
    """(K, W, 2) each story's candidate endings scored after the context of story ``lenders[k, w]``."""
    (k, w), shape = lenders.shape, pairs.shape[2:]
    n_slices, n_tokens = shape[0] - 1, shape[1]
    contexts = np.broadcast_to(pairs[lenders, :1, :-1], (k, w, 2, n_slices, n_tokens))  # lent contexts
    endings = np.broadcast_to(pairs[None, :, :, -1:], (k, w, 2, 1, n_tokens))  # the story's own endings
    swapped = np.concatenate([contexts, endings], axis=3).reshape((-1,) + shape)
    return batched(score, params, swapped, batch_size).reshape(k, w, 2)


def ending_priors(pairs: np.ndarray, ce: np.ndarray, other: np.ndarray) -> dict:
    """The PMI and ending-only scores (W, 2) from each ending's mean CE after its own context, ``ce``
    (W, 2), and after K lent ones, ``other`` (K, W, 2); ``tokens`` (W, 2) the endings' lengths. Also
    ``log_mean_prior`` (W, 2), mean_k log p(e | c_k):
    ``prior`` less it is the Jensen gap (≥ 0), which grows with how much p(e | c_k) varies over the
    lent contexts (``experiments.cloze_contexts`` measures what it does to the PMI rule)."""
    n_tok = np.sum(pairs[:, :, -1] != PAD_ID, axis=-1)  # (W, 2) tokens of each ending
    log_p_own = -ce * n_tok  # log p(e | c), summed over the ending's tokens
    log_p_lent = -other * n_tok  # (K, W, 2) log p(e | c_k)
    log_p_prior = np.logaddexp.reduce(log_p_lent, axis=0) - np.log(len(other))  # log mean_k p(e | c_k)
    return {
        "pmi": log_p_own - log_p_prior,
        "prior": log_p_prior,
        "log_mean_prior": np.mean(log_p_lent, axis=0),
        "tokens": n_tok,
        "contexts": len(other),
    }


def cloze_accuracy(
    score, params, pairs: np.ndarray, labels: np.ndarray, batch_size: int, n_contexts: int = CLOZE_CONTEXTS
) -> dict:
    """Story Cloze accuracy by the three rules (mean CE, PMI, ending only); labels (W,) index the right
    ending (0 or 1). A tie between the two endings' scores counts as half right (``cloze_ties``: how
    many per rule). ``cloze_correct`` keeps each story's outcome per rule (1 right, 0 wrong, 0.5 a
    tie, in story order), for paired tests between models on the same stories."""
    if not len(pairs):
        return {}
    scores = cloze_scores(score, params, pairs, batch_size, n_contexts)
    correct = {"mean_ce": outcomes(-scores["mean_ce"], labels)}  # the lower mean CE wins
    if "pmi" in scores:
        correct["pmi"] = outcomes(scores["pmi"], labels)
        correct["ending_only"] = outcomes(scores["prior"], labels)
    report = {"cloze_stories": len(pairs), "cloze_accuracy": float(np.mean(correct["mean_ce"]))}
    if "pmi" in scores:
        report["cloze_accuracy_normalised"] = float(np.mean(correct["pmi"]))
        report["cloze_accuracy_ending_only"] = float(np.mean(correct["ending_only"]))
        report["cloze_contexts"] = scores["contexts"]
    report["cloze_ties"] = {rule: int(np.sum(v == 0.5)) for rule, v in correct.items()}
    return report | {"cloze_correct": {rule: [_outcome(o) for o in v] for rule, v in correct.items()}}


def outcomes(scores: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """(W,) outcome of each story given its two endings' scores (W, 2), the higher winning: 1 when the
    labelled ending scores higher, 0 when lower, 0.5 on a tie."""
    mine, other = scores[np.arange(len(labels)), labels], scores[np.arange(len(labels)), 1 - labels]
    return np.where(mine > other, 1.0, np.where(mine < other, 0.0, 0.5))


def _outcome(value: float) -> int | float:
    """An outcome as JSON writes it: 1, 0 or 0.5."""
    return 0.5 if value == 0.5 else int(value)


def context_donors(story_index: np.ndarray) -> np.ndarray | None:
    """(W,) the window whose context S(0..T-1) each window is given instead of its own: a fixed
    derangement (a cyclic shift by the most windows any story has, so every donor is another story's
    window); None when the split has no such shift (fewer than two stories, or one story holding
    more than half of the windows)."""
    n = len(story_index)
    stories, counts = np.unique(story_index, return_counts=True)
    if len(stories) < 2:
        return None
    donors = (np.arange(n) + int(counts.max())) % n
    return None if np.any(story_index[donors] == story_index) else donors


def rollout(
    predict_and_score,
    params,
    states: np.ndarray,
    lengths: np.ndarray,
    n_slices: int,
    n_steps: int,
    batch_size: int,
    show: int = 0,
):
    """Roll out many stories at once. states (W, S, N) gold states, PAD-padded past each story's
    ``lengths`` (W,) (each ≥ T). Returns the predicted states (W, n_steps, N) and the CE of each gold
    sentence S(T+k) under the rolled-out window, (W, n_steps) with NaN past a story's end.

    Step k runs only on the stories it is reported for: those with a gold S(T+k) (their later steps
    need this prediction) and the first ``show`` (shown as examples); other rows stay 0 (PAD)."""
    n_stories, n_states, n_tokens = states.shape
    predictions = np.zeros((n_stories, n_steps, n_tokens), np.int32)
    ces = np.full((n_stories, n_steps), np.nan)
    windows = states[:, :n_slices].copy()
    for k in range(n_steps):
        gold = n_slices + k
        has_gold = lengths > gold
        rows = np.flatnonzero(has_gold | (np.arange(n_stories) < show))
        if not len(rows):
            break
        target = states[rows, gold] if gold < n_states else np.zeros((len(rows), n_tokens), states.dtype)
        full = np.concatenate([windows[rows], target[:, None]], axis=1)
        predicted, ce = batched(predict_and_score, params, full, batch_size)
        ces[rows, k] = np.where(has_gold[rows], ce, np.nan)
        predictions[rows, k] = predicted
        windows[rows] = np.concatenate([windows[rows, 1:], predicted[:, None]], axis=1)
    return predictions, ces


@dataclasses.dataclass(frozen=True)
class Evaluators:
    """The evaluations of one model on one mesh, from its programs; ``layout`` (single process) turns
    each window batch into what the eval step consumes (``rank4jax.engine.batches``)."""

    programs: object  # rank4jax.engine.programs.Programs
    batch_size: int
    layout: object = None

    def windows(self, params, windows: np.ndarray) -> dict:
        """Window loss, LS(T) and token accuracy over every window (exact means)."""
        p = self.programs
        return evaluate_windows(p.eval_step, params, windows, self.batch_size, p.batch_sharding, self.layout)

    def other_context(self, params, windows: np.ndarray, story_index: np.ndarray) -> dict:
        """``last_slice_ce_other_context``: LS(T) when each window's context S(0..T-1) is another
        story's (``context_donors``) and its targets are its own ({} when the split has no donors)."""
        donors = context_donors(story_index)
        if donors is None:
            return {}
        lent = np.concatenate([windows[donors, :-1], windows[:, -1:]], axis=1)
        return {"last_slice_ce_other_context": self.windows(params, lent)["last_slice_ce"]}

    def cloze(self, params, pairs: np.ndarray, labels: np.ndarray, n_contexts: int = CLOZE_CONTEXTS) -> dict:
        return cloze_accuracy(self.programs.score, params, pairs, labels, self.batch_size, n_contexts)

    def predict(self, params, windows: np.ndarray) -> np.ndarray:
        """Ŝ(T) (W, N) predicted from each window's S(0..T-1)."""
        return batched(self.programs.predict_and_score, params, windows, self.batch_size)[0]

    def rollout(self, params, states, lengths, n_slices: int, n_steps: int, show: int = 0):
        return rollout(
            self.programs.predict_and_score, params, states, lengths, n_slices, n_steps, self.batch_size, show
        )
