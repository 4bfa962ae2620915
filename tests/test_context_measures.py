"""The measures of how much a model uses the story: LS(T) with another story's context and the
context gain, the ending-only Story Cloze rule, and McNemar's exact test between two models."""

import math

import jax
import numpy as np
import pytest

from rank4jax.engine.data_setup import prepare_split
from rank4jax.evaluation.evaluators import cloze_accuracy, context_donors, ending_priors
from rank4jax.evaluation.report import evaluate_run
from rank4jax.evaluation.significance import mcnemar_exact, wilson_interval
from rank4jax.runs import load_run


def test_context_donors_are_a_derangement_across_stories():
    index = np.array([0, 0, 0, 3, 3, 5, 7, 7, 8])  # windows of five stories, grouped by story
    donors = context_donors(index)
    assert sorted(donors) == list(range(9))  # a permutation ...
    assert np.all(index[donors] != index)  # ... lending every window another story's context
    np.testing.assert_array_equal(donors, (np.arange(9) + 3) % 9)  # the shift by the largest story
    assert context_donors(np.array([4, 4, 4])) is None  # one story: nobody to lend
    assert context_donors(np.array([0, 0, 0, 1])) is None  # no shift keeps every window off its story


def test_context_gain_equals_the_swapped_windows_scored_by_hand(tiny_run_copy):
    """The report's LS(T) with lent contexts is the mean CE of each window's own S(T) after its donor's
    S(0..T-1), summed token by token here (float32 programs of their own: to 1e-5)."""
    report = evaluate_run(str(tiny_run_copy), split="validation", num_examples=0, rollout_steps=0)
    run = load_run(str(tiny_run_copy), report["step"])
    window_set = prepare_split(run.config, run.tokenizer, "validation")[1]
    windows, donors = window_set.windows, context_donors(window_set.story_index)
    swapped = np.concatenate([windows[donors, :-1], windows[:, -1:]], axis=1)
    score = jax.jit(lambda p, w: run.family.last_slice_ce(p, w, run.model_cfg))  # mean CE of S(T) per window
    tokens = np.sum(windows[:, -1] != 0, axis=1)
    by_hand = {name: float(np.sum(np.asarray(score(run.params, w)) * tokens) / tokens.sum())
               for name, w in (("own", windows), ("other", swapped))}  # fmt: skip
    assert report["last_slice_ce"] == pytest.approx(by_hand["own"], abs=1e-5)
    assert report["last_slice_ce_other_context"] == pytest.approx(by_hand["other"], abs=1e-5)
    assert report["context_gain"] == report["last_slice_ce_other_context"] - report["last_slice_ce"]


def test_the_ending_only_rule_picks_the_ending_with_the_higher_prior():
    """A scorer that ignores the context: the ending-only rule picks the likelier ending alone, and
    PMI, the own likelihood less that prior, is the same for both endings: a tie, half right."""
    n = 4
    pairs = np.zeros((3, 2, 2, n), np.int32)  # 3 stories, 2 endings, T = 1: context, ending
    pairs[:, :, 0, 0] = [[5], [6], [7]]  # each story's context
    pairs[:, 0, 1, :2], pairs[:, 1, 1, :3] = 9, 11  # ending 0: two tokens; ending 1: three
    mean_ce = {9: 2.0, 11: 0.5}  # per token, whatever the context: ending 1 is likelier (−1.5 > −4)

    def score(params, windows):
        return np.array([mean_ce.get(int(w[-1, 0]), 0.0) for w in windows])  # 0: a padding row

    labels = np.array([1, 0, 1])
    report = cloze_accuracy(score, None, pairs, labels, batch_size=4, n_contexts=2)
    assert report["cloze_correct"]["ending_only"] == [1, 0, 1]  # always ending 1: right where it is the label
    assert report["cloze_accuracy_ending_only"] == pytest.approx(2 / 3)
    assert report["cloze_correct"]["pmi"] == [0.5, 0.5, 0.5] and report["cloze_accuracy_normalised"] == 0.5
    assert report["cloze_ties"] == {"mean_ce": 0, "pmi": 3, "ending_only": 0}
    assert report["cloze_correct"]["mean_ce"] == [1, 0, 1] and report["cloze_contexts"] == 2


def test_the_pmi_prior_splits_into_a_log_mean_and_a_jensen_gap_by_hand():
    """Two stories, endings of one and two tokens, K = 2 lent contexts: the PMI prior log mean_k p(e | c_k)
    is the mean of the logs plus the Jensen gap, log cosh(1) where the two lent log-likelihoods differ
    by 2 and 0 where they agree. Story 0's right ending depends on its context and loses PMI to that
    gap; the rule without it (geometric) picks it."""
    from rank4jax.experiments.cloze_contexts import contrast_by_label, jensen_gap_by_label, rule_scores

    pairs = np.zeros((2, 2, 2, 4), np.int32)  # T = 1: a context, then the ending
    pairs[:, 0, 1, :1], pairs[:, 1, 1, :2] = 9, 11  # ending 0: one token; ending 1: two
    ce = np.array([[0.75, 0.5], [2.0, 1.0]])  # log p(e | c) = [[-0.75, -1], [-2, -2]]
    other = np.array([[[1.0, 1.0], [1.0, 1.0]], [[3.0, 1.0], [1.0, 2.0]]])  # log p(e | c_k): see below
    scores = ending_priors(pairs, ce, other)  # log p(e | c_0) = [[-1, -2], [-1, -2]], c_1: [[-3, -2], [-1, -4]]
    np.testing.assert_array_equal(scores["log_mean_prior"], [[-2.0, -2.0], [-1.0, -3.0]])
    gap = np.log(np.cosh(1.0))  # log((e^-1 + e^-3) / 2) + 2
    np.testing.assert_allclose(scores["prior"] - scores["log_mean_prior"], [[gap, 0], [0, gap]], rtol=0, atol=1e-15)
    rules = rule_scores(scores)
    np.testing.assert_allclose(rules["geometric"], [[1.25, 1.0], [-1.0, 1.0]], rtol=0, atol=1e-15)
    np.testing.assert_allclose(rules["pmi"], [[1.25 - gap, 1.0], [-1.0, 1.0 - gap]], rtol=0, atol=1e-15)
    labels = np.array([0, 1])
    assert list(np.argmax(rules["pmi"], axis=1) == labels) == [False, True]
    assert list(np.argmax(rules["geometric"], axis=1) == labels) == [True, True]
    by_label = jensen_gap_by_label(scores, labels)
    assert by_label["right_mean"] == pytest.approx(gap, abs=1e-15)
    assert (by_label["wrong_mean"], by_label["right_larger"]) == (0.0, 1.0)
    # the contrast per token: mean lent CE less own CE = [[1.25, 0.5], [-1, 0.5]]; summed: the geometric scores
    contrast = contrast_by_label(scores, labels)
    assert (contrast["per_token_right"], contrast["per_token_wrong"]) == (0.875, -0.25)
    assert (contrast["per_token_accuracy"], contrast["summed_accuracy"], contrast["equal_length_pairs"]) == (1, 1, 0)
    assert np.isnan(contrast["summed_accuracy_equal_length"])
    assert (contrast["tokens_right"], contrast["tokens_wrong"]) == (1.5, 1.5)  # 1 and 2 tokens; 2 and 1
    assert (contrast["right_longer"], contrast["right_shorter"]) == (0.5, 0.5)


def test_mcnemar_against_a_table_by_hand():
    first = [1, 1, 1, 1, 1, 0, 0, 1, 0, 1]  # right where only the first is: items 0, 1, 3, 4 (b = 4) ...
    second = [0, 0, 1, 0, 0, 1, 0, 1, 0, 1]  # ... only the second: item 5 (c = 1); both: 2, 7, 9
    out = mcnemar_exact(first, second)
    assert (out["only_first"], out["only_second"]) == (4, 1)
    assert out["p_value"] == 2 * (1 + 5) / 32  # 2·P(X ≤ 1), X ~ Binomial(5, 1/2) = 0.375
    assert mcnemar_exact([1, 0], [1, 0])["p_value"] == 1.0  # no discordant item
    assert mcnemar_exact([1] * 12, [0] * 12)["p_value"] == 2 / 2**12
    with pytest.raises(ValueError, match="differ in length"):
        mcnemar_exact([1, 0], [1])


def test_statistics_refuse_what_is_not_an_outcome_and_count_ties_half():
    """NaN, None and a 2-D array are refused by name; a tie (0.5) against a right answer is half a
    discordance; the Wilson interval takes a half-integer count (ties) and refuses a count beyond n."""
    for bad, message in (([float("nan"), 1], "item 0 is nan"), (None, "no outcomes"), ([[1, 0]], "one list")):
        with pytest.raises(ValueError, match=message):
            mcnemar_exact(bad, [0, 1])
    out = mcnemar_exact([0.5, 0.5, 1, 1], [1, 0, 0, 0])
    assert (out["only_first"], out["only_second"]) == (2, 0)  # 0.5 + 1 + 1 = 2.5 → 2 (banker's), 0.5 → 0
    lo, hi = wilson_interval(2.5, 10)
    assert lo < 0.25 < hi and wilson_interval(2.5, 10) != wilson_interval(2, 10)
    for bad in ((float("nan"), 10), (11, 10), (2, 10.5)):
        with pytest.raises(ValueError, match="wilson_interval"):
            wilson_interval(*bad)


def test_scipy_gives_the_exact_binomial_tail_at_story_cloze_sizes():
    """scipy's binomtest p against 2·Σ_{i ≤ min(b, c)} C(n, i) / 2^n at the discordant counts Story Cloze
    gives (up to ~300 of 1,571 stories), to 1e-12 relative: the printed digits cannot move."""
    for b, c in ((0, 1), (3, 9), (40, 40), (61, 95), (120, 171), (150, 151)):
        n = b + c
        exact = min(1.0, 2 * sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2**n)
        got = mcnemar_exact([1] * b + [0] * c, [0] * b + [1] * c)["p_value"]
        assert got == pytest.approx(exact, rel=1e-12) and f"{got:.3g}" == f"{exact:.3g}"


def test_wilson_interval_by_hand():
    lo, hi = wilson_interval(50, 100)
    half = 1.959963984540054 * math.sqrt(0.25 / 100 + 1.959963984540054**2 / 40000) / (1 + 1.959963984540054**2 / 100)
    assert (lo, hi) == pytest.approx((0.5 - half, 0.5 + half), abs=1e-15)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_context_spread_with_every_pool_lender_equals_the_evaluation(tiny_run_copy, tmp_path):
    """Drawing all P lenders of the pool is the evaluation's own rule with K = P (the same lenders,
    seed 0): every draw gives the report's PMI and ending-only accuracies, with no spread."""
    from rank4jax.experiments.cloze_contexts import context_spread

    header = "InputSentence1,InputSentence2,InputSentence3,InputSentence4,"
    header += "RandomFifthSentenceQuiz1,RandomFifthSentenceQuiz2,AnswerRightEnding\n"
    names = ["Anna", "Ben", "Cara", "Dan", "Eve", "Finn", "Gus", "Hal", "Ivy", "Jo"]
    rows = [
        f"{n} went out.,{n} saw a dog.,The dog ran.,{n} ran after it.,{n} caught the dog.,{n} ate soup.,{1 + i % 2}\n"
        for i, n in enumerate(names)
    ]
    path = tmp_path / "cloze.csv"
    path.write_text(header + "".join(rows), encoding="utf-8")
    result = context_spread(str(tiny_run_copy), str(path), pool=5, ks=(5,), draws=3)
    report = evaluate_run(
        str(tiny_run_copy), split="all", data_path=str(path), num_examples=0, rollout_steps=0, cloze_contexts=5
    )
    spread = result["by_k"][5]
    assert (result["stories"], result["pool"], result["mean_ce"]) == (10, 5, report["cloze_accuracy"])
    for rule, key in (("pmi", "cloze_accuracy_normalised"), ("ending_only", "cloze_accuracy_ending_only")):
        assert (spread[rule]["min"], spread[rule]["max"]) == (report[key], report[key])  # every draw
        assert spread[rule]["mean"] == pytest.approx(report[key], abs=1e-15) and spread[rule]["std"] < 1e-15
    assert spread["geometric"]["std"] < 1e-15  # the rule without the Jensen gap: no spread either
    assert spread["finite_pool_factor"] == 0.0
    assert set(result["jensen_gap"]) == {"right_mean", "wrong_mean", "right_larger"}
    assert result["contrast"]["summed_accuracy"] == pytest.approx(spread["geometric"]["mean"], abs=1e-15)  # one rule
    arrays = result["per_story"]  # what the command saves beside its table
    assert (arrays["own_ce"].shape, arrays["lent_ce"].shape, arrays["pairs"].shape[:2]) == (
        (10, 2),
        (5, 10, 2),
        (10, 2),
    )
    assert arrays["labels"].tolist() == [i % 2 for i in range(10)]
