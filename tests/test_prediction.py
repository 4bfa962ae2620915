"""predict_next / predict.py: the next state of a typed story, for every family."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rank4jax
from rank4jax.data.windows import encode_state
from rank4jax.errors import ConfigError
from rank4jax.models import baseline
from rank4jax.prediction import predict_next
from rank4jax.tokens import EOS_ID, PAD_ID
from tests.helpers import jitted_forward


def _story(run, n=4):
    """n sentences of the run's own words, the third with a word it never saw."""
    words = run.tokenizer.tokens[4:]
    sentences = [" ".join(words[3 * i : 3 * i + 3]) + " ." for i in range(n)]
    sentences[2] = "zzqx " + sentences[2]
    return sentences


def _window(run, sentences):
    return np.stack([encode_state(run.tokenizer, s, run.model_cfg.n_tokens) for s in sentences])[None]


def test_rank4_prediction_is_the_argmax_of_the_forward_at_s_t(tiny_run):
    run = rank4jax.load_run(str(tiny_run))
    sentences = _story(run, 5)  # one more than T: the first is not read
    prediction = predict_next(run, sentences, rollout=1)
    assert prediction.dropped == 1 and prediction.unknown == 1 and prediction.inputs[1].startswith("[UNK:zzqx] ")
    window = _window(run, sentences[1:])
    for state in prediction.states:
        logits = np.asarray(jitted_forward(run.params, jnp.asarray(window), run.model_cfg))[0, :, -1]  # (N, V)
        ids = logits.argmax(-1)
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        shown = len(state.tokens)
        assert [p for p, _ in state.tokens] == [run.tokenizer.piece(i) for i in ids[:shown]]
        np.testing.assert_allclose([q for _, q in state.tokens], probs[np.arange(shown), ids[:shown]], rtol=1e-5)
        assert state.text == run.tokenizer.decode(ids[:shown])
        assert shown == len(ids) or state.tokens[-1][0] in ".!?"  # cut after the first sentence end
        window = np.concatenate([window[:, 1:], ids[None, None].astype(np.int32)], axis=1)
    assert prediction.kind.startswith("the per-position argmax of S(T)")
    with pytest.raises(ConfigError, match="decodes nothing"):
        predict_next(run, sentences, temperature=0.5)
    with pytest.raises(ConfigError, match="reads T = 4 sentences; got 3"):
        predict_next(run, sentences[:3])


def test_baseline_prediction_is_its_free_running_decode(tiny_baseline_run):
    run = rank4jax.load_run(str(tiny_baseline_run))
    sentences = _story(run)
    prediction = predict_next(run, sentences)
    window = np.concatenate([_window(run, sentences), np.zeros((1, 1, run.model_cfg.n_tokens), np.int32)], axis=1)
    out = jax.jit(baseline.decode, static_argnums=2)(run.params, jnp.asarray(window), run.model_cfg)
    logits = np.asarray(out["logits"])[0]
    ids = logits.argmax(-1)[: run.model_cfg.n_tokens]
    end = next((j for j, i in enumerate(ids) if i == EOS_ID), len(ids))
    (state,) = prediction.states
    assert [p for p, _ in state.tokens] == [run.tokenizer.piece(i) for i in ids[:end] if i != PAD_ID]
    assert prediction.kind.endswith("(greedy)")
    top1 = predict_next(run, sentences, temperature=0.7, top_k=1, seed=3).states[0]  # top-1 sampling: the argmax
    assert [p for p, _ in top1.tokens] == [p for p, _ in state.tokens]
    coldest = predict_next(run, sentences, temperature=1e-45, seed=3).states[0]  # was sixteen <unk>: the argmax
    assert [p for p, _ in coldest.tokens] == [p for p, _ in state.tokens]
    subnormal = predict_next(run, sentences, temperature=1e-45, top_k=1, seed=3).states[0]  # was an empty sentence
    assert [p for p, _ in subnormal.tokens] == [p for p, _ in state.tokens]
    sampled = predict_next(run, sentences, temperature=5.0, seed=3).states[0]
    assert sampled == predict_next(run, sentences, temperature=5.0, seed=3).states[0]  # the seed's draw
    vocab = run.tokenizer.vocab_size
    with pytest.raises(ConfigError, match=f"top_k={vocab + 1} is more than the model's {vocab} tokens"):
        predict_next(run, sentences, temperature=1.0, top_k=vocab + 1)
    with pytest.raises(ConfigError, match="temperature must be a non-negative finite number"):
        predict_next(run, sentences, temperature=float("inf"))


def test_another_familys_parameters_are_refused_naming_the_family(tiny_baseline_run):
    run = rank4jax.load_run(str(tiny_baseline_run))
    cfg = rank4jax.Rank4Config(run.model_cfg.vocab_size, 8, 4, 4, 2, 2, 1)
    with pytest.raises(ConfigError, match="takes a rank4 model's parameters; these are a baseline model's"):
        rank4jax.forward(run.params, np.zeros((1, 4, 8), np.int32), cfg)
