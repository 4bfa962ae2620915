"""The one small interface through which training and evaluation drive a model family.

A family turns a run config's ``model`` section into a static model config and provides pure
functions over (params, windows). Windows are int32 (B, T+1, N): inputs S(0..T-1), targets
S(1..T). ``loss_sums`` returns additive sums (see ``rank4jax.models.rank4.losses``) so metrics
aggregate exactly over batches; ``objective`` is the training loss.

Families: ``rank4`` (the paper's model), ``baseline`` (the 1-D causal transformer of SPEC §7,
whose "window" loss is its free-running S(T)+EOS selection loss and whose "last slice" is the
content tokens of S(T), the same tokens as the rank-4 LS(T)), and the next-token families over each
window's token stream (``rank4jax.models.stream``): ``splm`` (the semantic-simulation LM) and ``baseline_lm`` (the
baseline as a teacher-forced token LM, its matched attention model). For those, "window" sums run
over every next token (EOS included; perplexity = exp(window_ce)) and "last slice" over the tokens
of S(T). ZPX scores are a config variant of the rank-4 and baseline families (``model.zpx``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rank4jax.errors import ConfigError
from rank4jax.models import baseline, decoding, flops, rank4, splm, stream
from rank4jax.models.losses import with_objective
from rank4jax.models.sizes import section_values
from rank4jax.models.zpx import zpx_config
from rank4jax.tokens import BOS_ID, EOS_ID, PAD_ID

SIZES = ("n_tokens", "n_slices", "dx", "dt", "n_layers")  # every family's required model fields


def read_section(section: Mapping, family: str, required: tuple, optional: dict) -> dict:
    """The values of a run config's ``model`` section for one family: the ``required`` keys and the
    ``optional`` ones (name → default); any other key is a ConfigError naming it and the family."""
    values = dict(section.items()) if section is not None else {}
    known = set(required) | set(optional)
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(
            f"model.{unknown[0]} is not a field of model_family={family!r} (its fields: {', '.join(sorted(known))})"
        )
    missing = [k for k in required if k not in values]
    if missing:
        raise ConfigError(f"model.{missing[0]} is missing (model_family={family!r} needs {', '.join(required)})")
    return {k: values.get(k, default) for k, default in optional.items()} | {k: values[k] for k in required}


@dataclasses.dataclass(frozen=True)
class ModelFamily:
    name: str
    # (model section, vocab size or None) → hashable model config. With None (the vocabulary is only
    # known after tokenizing) the section is validated and the config's vocab_size stays None.
    make_config: Callable[[Mapping, int | None], Any]
    init: Callable[[jax.Array, Any], Any]  # (key, cfg) → params
    loss_sums: Callable[..., dict]  # (params, windows, cfg, *, train, rng) → sums incl. "objective"
    # (params, windows (B,T+1,N), cfg) → (Ŝ(T) (B, N) predicted from S(0..T-1), (B,) mean CE of S(T)):
    # one forward for both where the family allows (rollout scores and predicts every window)
    predict_and_score: Callable[[Any, jax.Array, Any], tuple[jax.Array, jax.Array]]
    last_slice_ce: Callable[[Any, jax.Array, Any], jax.Array]  # (params, windows, cfg) → (B,) mean CE of S(T)
    count_params: Callable[[Any], int]
    # what the "window_*" sums of this family measure (its selection loss), for logs, plots and tables
    selection_loss: str = "window CE"
    # the keys of its model section (``rank4jax.engine.run_config.model_section`` converts one)
    fields: tuple[str, ...] = ()
    # cfg → the batch layouts loss_sums accepts besides full windows, each giving exactly the
    # full-width sums: "trimmed" (the token axis cut to N' < N by ``rank4jax.data.windows.trim_padding``)
    # and "compact" (``rank4jax.data.compact``: only the positions that can reach the loss).
    layouts: Callable[[Any], tuple[str, ...]] = lambda cfg: ()
    # (params, training windows (n, T+1, N) numpy, cfg) → params: data-derived buffers of a fresh run
    # (the SPLM's unigram surprisal); checkpoints keep them, so a resumed run never recomputes them.
    init_from_data: Callable[[Any, Any, Any], Any] | None = None
    # cfg → analytic FLOPs of one window's forward (``rank4jax.models.flops``); None: not counted
    forward_flops: Callable[[Any], int] | None = None
    # (params, inputs (B, T, N) = S(0..T-1), cfg, choose) → (Ŝ(T) (B, N), each token's probability (B, N)):
    # the next state for a user (``rank4jax.prediction``); ``choose`` (``rank4jax.models.decoding``)
    # picks each token of a decoding family, and ``prediction`` says what Ŝ(T) is
    next_state: Callable[..., tuple[jax.Array, jax.Array]] | None = None
    decodes: bool = True  # False: every token of Ŝ(T) at once (no choose, no sampling)
    language_model: bool = False  # a next-token LM over the stream: its reports add perplexity = exp(window_ce)
    prediction: str = "greedy decode"

    def selection_label(self, selection: str = "window") -> str:
        """What a run's selection loss measures (``SELECTIONS``): this family's window loss, or LS(T)."""
        return self.selection_loss if selection == "window" else "LS(T)"


# a run's selection loss (config.selection): the validation metric that picks its best checkpoint and
# drives early stopping → the evaluators' key. "window": the family's window loss (the paper's);
# "last_slice": LS(T), the mean CE over the content tokens of S(T) (an extra, comparable across families)
SELECTIONS = {"window": "window_ce", "last_slice": "last_slice_ce"}


# each family's model section: required keys, then optional ones with their defaults
RANK4_SECTION = (
    SIZES + ("n_heads", "dropout"),
    {"attention": "autodiff", "zpx": None, "objective_slices": "all", "token_code": "outer", "attention_grid": "joint"},
)
BASELINE_SECTION = (SIZES + ("n_heads", "dropout"), {"teacher_forcing": False, "zpx": None})
BASELINE_LM_SECTION = (SIZES + ("n_heads", "dropout"), {"zpx": None})
SPLM_SECTION = (SIZES, {"splm": None})


def _fields(section: tuple) -> tuple[str, ...]:
    required, optional = section
    return required + tuple(optional)


def _rank4_config(section: Mapping, vocab_size: int | None) -> rank4.Rank4Config:
    values = read_section(section, "rank4", *RANK4_SECTION)
    score = zpx_config(values.pop("zpx"))
    return rank4.Rank4Config(vocab_size=vocab_size, score=score, **values)


def _rank4_loss_sums(params, batch, cfg, *, train=False, rng=None) -> dict:
    """``batch``: windows (B, T+1, N' ≤ N) or a compact batch (``rank4jax.models.rank4.layout``)."""
    sums, aux = rank4.loss_sums(params, batch, cfg, train=train, rng=rng)
    over = "window" if cfg.objective_slices == "all" else "last_slice"  # S(1..T), the paper's, or S(T)
    return with_objective(sums, aux, cfg.score.aux_weight, over)


def _rank4_last_slice_ce(params, windows, cfg, logits=None):
    if logits is None:
        logits = rank4.next_state_logits(params, windows[:, :-1], cfg)  # (B, N, V): the readout at S(T) only
    return rank4.last_slice_mean_ce(logits[:, :, None], windows[:, -1:])  # as a window of one slice


def _rank4_predict_and_score(params, windows, cfg):
    logits = rank4.next_state_logits(params, windows[:, :-1], cfg)
    predicted = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return predicted, _rank4_last_slice_ce(params, windows, cfg, logits)


def _rank4_next_state(params, inputs, cfg, choose=None):
    del choose  # every position at once: nothing is decoded
    logits = rank4.next_state_logits(params, inputs, cfg)
    tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return tokens, decoding.chosen_probability(logits, tokens)


RANK4 = ModelFamily(
    name="rank4",
    make_config=_rank4_config,
    init=rank4.init_params,
    loss_sums=_rank4_loss_sums,
    predict_and_score=_rank4_predict_and_score,
    last_slice_ce=_rank4_last_slice_ce,
    count_params=rank4.count_params,
    selection_loss="window CE over every target of S(1..T)",
    fields=_fields(RANK4_SECTION),
    layouts=lambda cfg: ("trimmed", "compact") if cfg.attention == "autodiff" else ("trimmed",),
    forward_flops=flops.rank4_forward,
    next_state=_rank4_next_state,
    decodes=False,
    prediction="the per-position argmax of S(T): every token at once, not a generated sentence",
)


def _baseline_config(section: Mapping, vocab_size: int | None, family: str = "baseline") -> baseline.BaselineConfig:
    values = read_section(section, family, *(BASELINE_SECTION if family == "baseline" else BASELINE_LM_SECTION))
    score = zpx_config(values.pop("zpx"))
    values["teacher_forcing"] = bool(values.get("teacher_forcing", False))
    return baseline.BaselineConfig(vocab_size=vocab_size, score=score, **values)


def _baseline_loss_sums(params, windows, cfg, *, train=False, rng=None) -> dict:
    out = baseline.decode(params, windows, cfg, train=train, rng=rng)
    return with_objective(baseline.target_sums(out["logits"], out["targets"]), out["aux"], cfg.score.aux_weight)


def _baseline_last_slice_ce(params, windows, cfg):
    out = baseline.decode(params, windows, cfg)
    return baseline.content_mean_ce(out["logits"], out["targets"])


def _baseline_predict_and_score(params, windows, cfg):
    """Greedy free-running Ŝ(T) (tokens up to the first EOS, PAD after, as an (N,) state) and the
    S(T) score. Free-running logits never depend on the gold S(T), so one decode gives both (a
    second, teacher-forced one scores when ``cfg.teacher_forcing``)."""
    out = baseline.decode(params, windows, cfg, teacher_forcing=False)
    tokens = jnp.argmax(out["logits"], axis=-1)[:, : cfg.n_tokens].astype(jnp.int32)
    ended = jnp.cumsum(tokens == EOS_ID, axis=1) > 0
    score = _baseline_last_slice_ce(params, windows, cfg) if cfg.teacher_forcing else None
    if score is None:
        score = baseline.content_mean_ce(out["logits"], out["targets"])
    return jnp.where(ended, PAD_ID, tokens), score


def _baseline_next_state(params, inputs, cfg, choose=decoding.greedy):
    """Free-running Ŝ(T) (tokens up to the first EOS, PAD after) and each fed token's probability."""
    windows = jnp.concatenate([inputs, jnp.zeros_like(inputs[:, :1])], axis=1)  # no gold S(T): never read
    out = baseline.decode(params, windows, cfg, teacher_forcing=False, choose=choose)
    tokens = out["fed"].astype(jnp.int32)
    probs = decoding.chosen_probability(out["logits"][:, : cfg.n_tokens], tokens)
    return jnp.where(jnp.cumsum(tokens == EOS_ID, axis=1) > 0, PAD_ID, tokens), probs


BASELINE = ModelFamily(
    name="baseline",
    make_config=_baseline_config,
    init=baseline.init_params,
    loss_sums=_baseline_loss_sums,
    predict_and_score=_baseline_predict_and_score,
    last_slice_ce=_baseline_last_slice_ce,
    count_params=baseline.count_params,
    selection_loss="free-running S(T)+EOS CE",
    fields=_fields(BASELINE_SECTION),
    forward_flops=flops.baseline_forward,
    next_state=_baseline_next_state,
    prediction="free-running decode of S(T), each token after the model's own earlier ones",
)


def _stream_family(name: str, make_config, init, logits_and_penalty, count_params, **extra) -> ModelFamily:
    """A next-token family over each window's token stream, from one function
    ``logits_and_penalty(params, stream_inputs (B, S), cfg, *, train, rng) -> (logits (B, S, V), penalty)``
    whose penalty (a scalar regulariser) joins the mean next-token CE in the objective."""

    def loss_sums(params, windows, cfg, *, train=False, rng=None) -> dict:
        packed = stream.pack_stream(windows)
        logits, penalty = logits_and_penalty(params, packed["inputs"], cfg, train=train, rng=rng)
        return with_objective(stream.stream_sums(logits, packed["targets"], packed["last"]), penalty)

    def last_slice_ce(params, windows, cfg):
        packed = stream.pack_stream(windows)
        logits, _ = logits_and_penalty(params, packed["inputs"], cfg)
        return stream.last_state_mean_ce(logits, packed["targets"], packed["last"])

    def predict_and_score(params, windows, cfg):
        logits_fn = lambda s: logits_and_penalty(params, s, cfg)[0]  # noqa: E731
        return stream.greedy_last_state(logits_fn, windows[:, :-1], cfg.n_tokens), last_slice_ce(params, windows, cfg)

    def next_state(params, inputs, cfg, choose=decoding.greedy):
        logits_fn = lambda s: logits_and_penalty(params, s, cfg)[0]  # noqa: E731
        return stream.decode_last_state(logits_fn, inputs, cfg.n_tokens, choose)

    return ModelFamily(
        name,
        make_config,
        init,
        loss_sums,
        predict_and_score,
        last_slice_ce,
        count_params,
        selection_loss="next-token CE over the stream",
        language_model=True,
        next_state=next_state,
        prediction="next-token decode of S(T) after the story's tokens",
        **extra,
    )


def _baseline_lm_logits(params, inputs, cfg, *, train=False, rng=None):
    return baseline.stream_logits(params, inputs, cfg, train=train, rng=rng), 0.0


# The 1-D baseline as a teacher-forced next-token LM over each window's token stream: the matched
# attention model for the SPLM (same stream, same loss).
BASELINE_LM = _stream_family(
    "baseline_lm",
    functools.partial(_baseline_config, family="baseline_lm"),
    baseline.init_params,
    _baseline_lm_logits,
    baseline.count_params,
    fields=_fields(BASELINE_LM_SECTION),
    forward_flops=flops.stream_forward,
)


def _splm_config(section: Mapping, vocab_size: int | None) -> splm.SPLMConfig:
    values = read_section(section, "splm", *SPLM_SECTION)
    known = {f.name for f in dataclasses.fields(splm.SPLMConfig)} - set(SIZES) - {"vocab_size", "xi_stop_gradient"}
    extra = section_values(values.pop("splm"), known, "model.splm")
    if "xi_alphas" in extra:
        extra["xi_alphas"] = tuple(extra["xi_alphas"])
    return splm.SPLMConfig(vocab_size=vocab_size, **values, **extra)


def _splm_logits(params, inputs, cfg, *, train=False, rng=None):
    """Logits and λ_V·mean(V_θ²) over the real slots. No dropout: train and eval are the same."""
    del train, rng
    logits, v_last = splm.forward(params, inputs, cfg)
    real = (inputs != PAD_ID).astype(v_last.dtype)
    return logits, cfg.lambda_v * jnp.sum(v_last**2 * real) / jnp.maximum(jnp.sum(real), 1)


def _splm_init_from_data(params, train_windows, cfg):
    """The surprisal table from the training streams' input tokens (BOS + every token)."""
    tokens = np.asarray(train_windows).reshape(-1)
    counts = np.bincount(tokens[tokens != PAD_ID], minlength=cfg.vocab_size).astype(np.float64)
    counts[BOS_ID] += len(train_windows)
    return splm.set_surprisal(params, counts)


SPLM = _stream_family(
    "splm",
    _splm_config,
    splm.init_params,
    _splm_logits,
    splm.count_params,
    init_from_data=_splm_init_from_data,
    fields=_fields(SPLM_SECTION),
)

FAMILIES = {f.name: f for f in (RANK4, BASELINE, BASELINE_LM, SPLM)}


def run_param_count(config, vocab_size: int) -> int:
    """The parameter count of a run config's model at a vocabulary size (``jax.eval_shape``)."""
    family = get_family(config.model_family)
    return family.count_params(family.make_config(config.model, vocab_size))


def objective_label(model_cfg) -> str:
    """What a model's training objective averages over, in words (the rank-4 ``objective_slices``;
    the other families train on their window loss)."""
    slices = getattr(model_cfg, "objective_slices", None)
    return {None: "the family's window loss", "all": "every target of S(1..T)", "last": "S(T) only"}[slices]


def get_family(name: str) -> ModelFamily:
    if name not in FAMILIES:
        raise ConfigError(f"model_family must be one of {sorted(FAMILIES)}, got {name!r}")
    return FAMILIES[name]
