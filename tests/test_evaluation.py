"""Batched evaluation (rollout, Story Cloze scoring by the three rules, next-state readout) against
per-story references; ``eval.py --split=all``; ``--rollout_steps`` 0 and negative; the ROCStories
configs on a slice of the shared file."""

import csv
import functools
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rank4jax
from rank4jax.data.windows import cloze_windows
from rank4jax.errors import ConfigError
from rank4jax.evaluation.evaluators import cloze_scores, other_contexts, outcomes, rollout
from rank4jax.evaluation.report import evaluate_run, report_stem
from rank4jax.models import baseline as bl
from rank4jax.models.family import BASELINE, RANK4
from rank4jax.runs import load_run
from tests.conftest import REPO
from tests.helpers import jitted_forward, numpy_params, tiny_config

SHARED_ROC = REPO.parent / "shared" / "data" / "rocstories_spring2016_first45000.csv"
V, N, T = 40, 5, 3


@functools.cache  # built once per worker; call under x64
def _models():
    """(family, cfg, float64 params) for a tiny rank-4 model and a tiny baseline (parameters drawn with
    numpy at the init's scale: the jax init compiles a program per parameter shape)."""
    r4 = rank4jax.Rank4Config(V, N, T, dx=4, dt=2, n_heads=2, n_layers=2, dropout=0.0)
    base = bl.BaselineConfig(V, N, T, dx=4, dt=2, n_heads=2, n_layers=2, dropout=0.0)
    return [
        (RANK4, r4, numpy_params(rank4jax.init_params, r4, np.float64, seed=3)),
        (BASELINE, base, numpy_params(bl.init_params, base, np.float64, seed=3)),
    ]


def _states(lengths, seed=0):
    """(W, S, N) random gold states with PAD tails, PAD rows past each story's length."""
    rng = np.random.default_rng(seed)
    states = rng.integers(4, V, size=(len(lengths), max(lengths), N)).astype(np.int32)
    states[:, :, 3:] = 0
    states[::2, :, 2:] = 0
    for i, n in enumerate(lengths):
        states[i, n:] = 0
    return states


def _rollout_one_story(predict_and_score, score, params, states, n_steps):
    """The per-story reference: one story at a time, as eval.py did before batching."""
    window, predictions, ces = states[:T].copy(), [], []
    for k in range(n_steps):
        if T + k < len(states):
            ces.append(float(score(params, np.concatenate([window, states[T + k][None]])[None])[0]))
        else:
            ces.append(None)
        gold = np.zeros((1, N), np.int32)
        predicted = np.asarray(predict_and_score(params, np.concatenate([window, gold])[None])[0])[0]
        predictions.append(predicted)
        window = np.concatenate([window[1:], predicted[None]])
    return np.stack(predictions), ces


def make_scorers(family, cfg):
    """The family's (predict_and_score, score), jitted for float64 parameters on one device."""
    return (
        jax.jit(lambda p, w: family.predict_and_score(p, w, cfg)),
        jax.jit(lambda p, w: family.last_slice_ce(p, w, cfg)),
    )


@pytest.mark.parametrize("which", [0, 1], ids=["rank4", "baseline"])
def test_batched_rollout_equals_the_per_story_rollout(which):
    lengths = np.array([T, T + 1, T + 3, T + 1, T + 2, T + 3, T])
    with jax.enable_x64(True):
        family, cfg, params = _models()[which]
        predict_and_score, score = make_scorers(family, cfg)
        states = _states(lengths)
        predictions, ces = rollout(predict_and_score, params, states, lengths, T, 3, batch_size=3, show=2)
        for i, n in enumerate(lengths):
            ref_pred, ref_ce = _rollout_one_story(predict_and_score, score, params, states[i, :n], 3)
            for k in range(3):
                if ref_ce[k] is None:
                    assert np.isnan(ces[i, k])
                else:
                    np.testing.assert_allclose(ces[i, k], ref_ce[k], rtol=1e-12)
                if i < 2 or T + k < n:  # computed where reported: examples, and wherever a gold sentence follows
                    np.testing.assert_array_equal(predictions[i, k], ref_pred[k])
        assert np.isnan(ces[:, 2][lengths <= T + 2]).all() and not np.isnan(ces[:, 0][lengths > T]).any()


@pytest.mark.parametrize("which", [0, 1], ids=["rank4", "baseline"])
def test_batched_cloze_scores_equal_per_story_scores(which):
    rng = np.random.default_rng(1)
    pairs = np.repeat(_states([T + 1] * 6, seed=2)[:, None], 2, axis=1)  # (W, 2, T+1, N), same context
    pairs[:, 1, -1] = rng.integers(4, V, size=(6, N))
    pairs[:, 1, -1, 4:] = 0
    with jax.enable_x64(True):
        family, cfg, params = _models()[which]
        _, score = make_scorers(family, cfg)
        scores = cloze_scores(score, params, pairs, batch_size=4, n_contexts=3)
        lenders = other_contexts(6, 3)
        for w in range(6):
            for c in range(2):
                own = float(score(params, pairs[w, c][None])[0])
                np.testing.assert_allclose(scores["mean_ce"][w, c], own, rtol=1e-12)
                n_tok = np.sum(pairs[w, c, -1] != 0)
                others = []
                for lender in lenders[:, w]:
                    assert lender != w
                    swapped = np.concatenate([pairs[lender, 0, :-1], pairs[w, c, -1:]])
                    others.append(-float(score(params, swapped[None])[0]) * n_tok)
                pmi = -own * n_tok - (np.logaddexp.reduce(others) - np.log(3))
                np.testing.assert_allclose(scores["pmi"][w, c], pmi, rtol=1e-10, atol=1e-12)
    assert scores["contexts"] == 3 and sorted(set(lenders[:, 0])) == sorted(lenders[:, 0])


def test_next_state_readout_equals_the_full_forward_last_slice():
    with jax.enable_x64(True):
        family, cfg, params = _models()[0]
        windows = _states([T + 1] * 4)
        next_state = jax.jit(rank4jax.models.rank4.next_state_logits, static_argnums=2)
        all_logits = jitted_forward(params, jnp.asarray(windows[:, :T]), cfg)
        logits = all_logits[:, :, -1]
        np.testing.assert_allclose(next_state(params, jnp.asarray(windows[:, :T]), cfg), logits, rtol=1e-12)
        predicted, ce = jax.jit(family.predict_and_score, static_argnums=2)(params, jnp.asarray(windows), cfg)
        np.testing.assert_array_equal(predicted, jnp.argmax(logits, -1))
        full = rank4jax.models.rank4.last_slice_mean_ce(all_logits, windows[:, 1:])
        np.testing.assert_allclose(ce, full, rtol=1e-12)


CLOZE_ROWS = [
    ("Tom had a dog.", "The dog was old.", "Tom walked the dog.", "The dog got tired.", "Tom rested.", "Tom flew.", 1),
    ("Ann baked a cake.", "It was for Bob.", "Bob came home.", "He saw the cake.", "Bob smiled.", "Bob swam.", 1),
    ("Sue lost a key.", "She looked hard.", "She asked Tom.", "Tom found it.", "Sue ran.", "Sue thanked Tom.", 2),
    ("Jim was hungry.", "He had no food.", "He went out.", "He found a shop.", "He sang.", "He bought bread.", 2),
    ("Kim had a test.", "She studied.", "The test came.", "It was easy.", "Kim passed.", "Kim cried.", 1),
]


def test_ties_count_half(tiny_run_copy, tmp_path):
    """Story Cloze stories whose two endings are the same text tie under every rule: each counts half
    right (50 %, whichever ending the file calls right) and the report counts the ties."""
    path = tmp_path / "ties.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["InputSentence1", "InputSentence2", "InputSentence3", "InputSentence4",
                         "RandomFifthSentenceQuiz1", "RandomFifthSentenceQuiz2", "AnswerRightEnding"])  # fmt: skip
        writer.writerows(row[:4] + (row[4], row[4], 1 + n % 2) for n, row in enumerate(CLOZE_ROWS))
    report = evaluate_run(str(tiny_run_copy), split="all", data_path=str(path), num_examples=0, rollout_steps=0)
    assert (report["cloze_accuracy"], report["cloze_accuracy_normalised"], report["cloze_accuracy_ending_only"]) == (
        0.5, 0.5, 0.5)  # fmt: skip
    assert report["cloze_ties"] == {"mean_ce": 5, "pmi": 5, "ending_only": 5}
    assert report["cloze_correct"]["mean_ce"] == [0.5] * 5


def test_split_all_scores_every_story_of_a_labelled_file(tiny_run_copy, tmp_path):
    path = tmp_path / "cloze.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["InputSentence1", "InputSentence2", "InputSentence3", "InputSentence4",
                         "RandomFifthSentenceQuiz1", "RandomFifthSentenceQuiz2", "AnswerRightEnding"])  # fmt: skip
        writer.writerows(CLOZE_ROWS)
    own = evaluate_run(str(tiny_run_copy), split="test", rollout_steps=0)
    report = evaluate_run(str(tiny_run_copy), split="all", data_path=str(path), num_examples=1, rollout_steps=0)
    assert report["stories"] == report["windows"] == report["cloze_stories"] == 5
    # the accuracy, recomputed story by story with the restored parameters
    run = load_run(str(tiny_run_copy))
    params, config, tokenizer = run.params, run.config, run.tokenizer
    cfg = RANK4.make_config(config.model, tokenizer.vocab_size)
    from rank4jax.data.readers import read_stories

    pairs, labels = cloze_windows(read_stories(str(path)), tokenizer, cfg.n_tokens, cfg.n_slices)
    assert labels.tolist() == [0, 0, 1, 1, 0]
    score = jax.jit(functools.partial(RANK4.last_slice_ce, cfg=cfg))
    ce = np.array([[float(score(params, pairs[w, c][None])[0]) for c in range(2)] for w in range(5)])
    assert report["cloze_accuracy"] == np.mean(outcomes(-ce, labels))  # a tie (UNK-only endings) half right
    # PMI and ending only by hand: with 5 stories and K = 4, every other story lends its context
    n_tok = np.sum(pairs[:, :, -1] != 0, axis=-1)
    prior = np.zeros((5, 2))
    for w in range(5):
        for c in range(2):
            lent = [np.concatenate([pairs[j, 0, :-1], pairs[w, c, -1:]])[None] for j in range(5) if j != w]
            log_p = np.array([-float(score(params, x)[0]) * n_tok[w, c] for x in lent])
            prior[w, c] = np.log(np.mean(np.exp(log_p.astype(np.float64))))
    pmi = -ce * n_tok - prior
    assert report["cloze_contexts"] == 4
    scores = cloze_scores(score, params, pairs, 4, n_contexts=4)  # what evaluate_run's evaluator computes
    np.testing.assert_allclose(scores["pmi"], pmi, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(scores["prior"], prior, rtol=1e-5, atol=1e-4)
    by_hand = {"mean_ce": outcomes(-ce, labels), "pmi": outcomes(pmi, labels), "ending_only": outcomes(prior, labels)}
    assert report["cloze_correct"] == {rule: v.tolist() for rule, v in by_hand.items()}  # story by story
    assert report["cloze_accuracy_normalised"] == np.mean(by_hand["pmi"])
    assert report["cloze_accuracy_ending_only"] == np.mean(by_hand["ending_only"])
    # its own file name: the run's test report is not overwritten
    assert os.path.basename(report["path"]) == f"{report_stem(str(path))}.all_step{report['step']}.json"
    assert report_stem(str(path)).startswith("cloze-") and len(report_stem(str(path))) == len("cloze-") + 8
    assert json.load(open(own["path"]))["split"] == "test" and own["path"] != report["path"]
    other = tmp_path / "elsewhere" / "cloze.csv"  # the same name in another directory: its own report
    other.parent.mkdir()
    shutil.copy(path, other)
    again = evaluate_run(str(tiny_run_copy), split="all", data_path=str(other), num_examples=0, rollout_steps=0)
    assert again["path"] != report["path"] and os.path.isfile(report["path"])
    assert "rollout_mean_ce" not in report and "rollout_mean_ce" not in own  # --rollout_steps=0 skips it


def test_rollout_steps_zero_and_negative(tiny_run_copy):
    with pytest.raises(ConfigError, match="rollout_steps must be a non-negative integer"):
        evaluate_run(str(tiny_run_copy), rollout_steps=-1)
    report = evaluate_run(str(tiny_run_copy), split="all", rollout_steps=0)
    assert "rollout_mean_ce" not in report and report["split"] == "all"


def test_rocstories_configs_share_windows_and_match_parameters():
    if not SHARED_ROC.is_file():
        pytest.skip(f"shared ROCStories data not found at {SHARED_ROC} (present in CI, absent on a fresh clone)")
    from configs import baseline_rocstories, rocstories
    from rank4jax.data import tokenizers, windows
    from rank4jax.engine.data_setup import load_stories
    from rank4jax.engine.run_config import tokenizer_options
    from rank4jax.experiments.compare import _check_same_windows

    r4, base = rocstories.get_config(), baseline_rocstories.get_config()
    _check_same_windows(r4, base)
    stories, _ = load_stories(r4)
    train_split = windows.split_stories(stories, tuple(r4.data.split))["train"]
    texts = [s for story in train_split for s in story.sentences]
    vocab = tokenizers.build_tokenizer("word", texts, **tokenizer_options(r4)).vocab_size
    n_r4 = RANK4.count_params(RANK4.make_config(r4.model, vocab))
    n_base = BASELINE.count_params(BASELINE.make_config(base.model, vocab))
    assert (vocab, n_r4, n_base) == (14_171, 914_784, 937_860)
    assert abs(n_base / n_r4 - 1) < 0.10


def test_a_language_models_report_gives_its_perplexity(tmp_path, tiny_run_copy):
    """The next-token LM families (baseline_lm, splm) report perplexity = exp(next-token CE over the
    stream); the window models do not (their window CE is no per-token LM loss)."""
    import math

    from rank4jax.training.loop import train

    train(tiny_config(model_family="baseline_lm"), str(tmp_path))
    report = evaluate_run(str(tmp_path), split="validation", num_examples=0, rollout_steps=0)
    assert report["perplexity"] == math.exp(report["window_ce"])
    assert "perplexity" not in evaluate_run(str(tiny_run_copy), split="validation", num_examples=0, rollout_steps=0)
