"""The 1-D causal transformer baseline of SPEC §7, trained free-running with a key/value cache.

Axes: B batch, T context sentences, N tokens per sentence, S sequence slots, D = dx·dt width,
H heads, E = D/H head width, V vocabulary, J = N+1 target slots (S(T) tokens then EOS).

Sequence layout (static shapes): slots [0, Lc) hold the packed context — BOS then the non-PAD
tokens of S(0..T-1) in temporal order, PAD after (Lc = 1 + T·N) — and slots [Lc, Lc+N) hold the
tokens fed while decoding. No gold S(T) token ever enters the context. Target j is predicted at
the last context token (j = 0) or at the slot of fed token j−1; a fed token's position id is
context_length + j, so positions are contiguous whatever the padding.

Free-running (the paper's protocol): fed token j is the model's own argmax for target j; every
target is scored against the gold token. ``lax.scan`` runs one incremental step per target token
over a per-layer K/V cache. Teacher forcing (feed the gold token) is a flag, never the reported
comparison.

An attention-score variant (``cfg.score``, ``rank4jax.models.scores``) reads each layer's normalised
stream, keeps what it needs in the layer's cache beside K and V, and adds a term to every head's
score before the causal and padding mask; the paper's baseline holds ``STANDARD``.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax

from rank4jax.models import common, decoding, losses
from rank4jax.models.baseline.config import BaselineConfig
from rank4jax.models.common import (
    apply_mlp,
    dropout,
    init_layer_norm,
    init_mlp,
    layer_norm,
    masked_softmax,
    sinusoid_table,
    token_rows,
    uniform_fan_in,
    wide_dtype,
)
from rank4jax.models.scores import init_layer_params, layer_params
from rank4jax.tokens import BOS_ID, EOS_ID, PAD_ID


def init_params(key: jax.Array, cfg: BaselineConfig, dtype=jnp.float32) -> dict:
    """E ~ N(0, 1/D) with the PAD row zero (inputs are scaled by sqrt(D), so tied logits Y·Eᵀ start
    at unit scale) [choice]; WQ/WK/WV/WO (D, D) and the MLP ~ U(±1/sqrt(fan_in)); LN 1/0."""
    d = cfg.width
    k_embed, k_layers = jax.random.split(key)
    embed = (jax.random.normal(k_embed, (cfg.vocab_size, d), dtype) / np.sqrt(d)).at[PAD_ID].set(0)
    layers = []
    for layer_key in jax.random.split(k_layers, cfg.n_layers):
        kq, kk, kv, ko, km = jax.random.split(layer_key, 5)
        layer = {
            "ln_attn": init_layer_norm((d,), dtype),
            "attn": {n: uniform_fan_in(k, (d, d), d, dtype) for n, k in zip("qkvo", (kq, kk, kv, ko), strict=True)},
            "ln_mlp": init_layer_norm((d,), dtype),
            "mlp": init_mlp(km, d, dtype),
        }
        layers.append(layer | init_layer_params(cfg.score, layer_key, d, dtype))
    return {"embed": embed, "layers": layers, "final_ln": init_layer_norm((d,), dtype)}


def _compact(tokens: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Move the non-PAD tokens of each row to the front, order kept. (B, M) → (tokens, counts)."""
    order = jnp.argsort(tokens == PAD_ID, axis=1, stable=True)
    return jnp.take_along_axis(tokens, order, axis=1), jnp.sum(tokens != PAD_ID, axis=1)


def pack(windows: jax.Array, cfg: BaselineConfig) -> dict:
    """windows (B, T+1, N) → context (B, Lc), context_len (B,), targets (B, J) = S(T) tokens + EOS."""
    batch = windows.shape[0]
    chex.assert_shape(windows, (batch, cfg.n_slices + 1, cfg.n_tokens))
    body, body_len = _compact(windows[:, :-1].reshape(batch, -1))
    context = jnp.concatenate([jnp.full((batch, 1), BOS_ID, windows.dtype), body], axis=1)
    target, target_len = _compact(windows[:, -1])
    targets = jnp.concatenate([target, jnp.zeros((batch, 1), windows.dtype)], axis=1)
    # EOS follows S(T); a window whose S(T) is empty (an all-PAD padding row) has no target at all
    eos_here = (jnp.arange(cfg.target_slots)[None] == target_len[:, None]) & (target_len[:, None] > 0)
    targets = jnp.where(eos_here, EOS_ID, targets)
    return {"context": context, "context_len": body_len + 1, "targets": targets}


def _embed(params, tokens, positions, cfg):
    table = jnp.asarray(sinusoid_table(cfg.context_slots + cfg.target_slots, cfg.width), params["embed"].dtype)
    return token_rows(params["embed"], tokens) * float(np.sqrt(cfg.width)) + table[positions]


def _layer(layer, x, cache, start, key_ok, cfg, *, train, rng):
    """x (B, Q, D) at slots [start, start+Q) → (x, cache). cache: k, v (B, H, S, E) and the score
    variant's entries; key_ok (B, Q, S) which cached slots each query may attend to."""
    r_attn, r_mlp = common.split_keys(rng)
    with jax.named_scope("attention"):  # the names a profile shows (rank4jax.training.profiling)
        out, new = _attend(layer, x, cache, start, key_ok, cfg)
        x = x + dropout(out, cfg.dropout, r_attn, train)
    with jax.named_scope("mlp"):
        u = layer_norm(x, layer["ln_mlp"]["scale"], layer["ln_mlp"]["bias"])
        return x + dropout(apply_mlp(layer["mlp"], u), cfg.dropout, r_mlp, train), new


def _attend(layer, x, cache, start, key_ok, cfg):
    """The attention branch of :func:`_layer`: (its output (B, Q, D) before dropout, the new cache)."""
    batch, q_len, d = x.shape
    heads, e = cfg.n_heads, d // cfg.n_heads
    u = layer_norm(x, layer["ln_attn"]["scale"], layer["ln_attn"]["bias"])

    def split_heads(w):
        return jnp.einsum("bqd,de->bqe", u, w).reshape(batch, q_len, heads, e).transpose(0, 2, 1, 3)

    q, k, v = (split_heads(layer["attn"][n]) for n in "qkv")
    new = {
        "k": jax.lax.dynamic_update_slice_in_dim(cache["k"], k, start, axis=2),
        "v": jax.lax.dynamic_update_slice_in_dim(cache["v"], v, start, axis=2),
    }
    rows = jnp.arange(q_len)
    real = key_ok[:, rows, start + rows]  # (B, Q): the query's own slot holds a real token
    extra, entries = cfg.score.cached_scores(layer_params(cfg.score, layer), u, cache, start, real)
    new |= entries
    scores = jnp.einsum("bhqe,bhse->bhqs", q, new["k"]) / float(np.sqrt(e))  # a weak scalar: keeps the dtype
    if extra is not None:
        scores = scores + extra[:, None]
    weights = masked_softmax(scores, key_ok[:, None])
    out = jnp.einsum("bhqs,bhse->bhqe", weights, new["v"])
    return jnp.einsum("bqd,de->bqe", out.transpose(0, 2, 1, 3).reshape(batch, q_len, d), layer["attn"]["o"]), new


def _run(params, x, caches, start, key_ok, cfg, *, train, rng, read=None):
    """The layers over x (B, Q, D) at slots [start, start+Q) → (logits, caches). ``read`` (B, Q')
    picks the slots whose logits are needed (the tied readout, the costliest matmul at a large
    vocabulary, then runs on those only); None reads every slot."""
    new_caches = []
    for index, (layer, cache) in enumerate(zip(params["layers"], caches, strict=True)):
        layer_rng = common.fold_in_keys(rng, index)
        x, cache = _layer(layer, x, cache, start, key_ok, cfg, train=train, rng=layer_rng)
        new_caches.append(cache)
    if read is not None:
        x = jnp.take_along_axis(x, read[..., None], axis=1)
    y = layer_norm(x, params["final_ln"]["scale"], params["final_ln"]["bias"])
    with jax.named_scope("readout"):
        return jnp.einsum("bqd,vd->bqv", y, params["embed"], preferred_element_type=wide_dtype(y)), new_caches


def _slot_valid(context_len, cfg):
    """(B, S): context slots hold real tokens below context_len; decode slots are always real."""
    slots = jnp.arange(cfg.context_slots + cfg.n_tokens)
    return (slots[None] < context_len[:, None]) | (slots[None] >= cfg.context_slots)


def _empty_caches(params, batch: int, cfg: BaselineConfig) -> list:
    """Per layer zeros: k, v (B, H, S, E) with S = Lc + N slots, and the score variant's entries."""
    slots, dtype = cfg.context_slots + cfg.n_tokens, params["embed"].dtype
    cache = {name: jnp.zeros((batch, cfg.n_heads, slots, cfg.width // cfg.n_heads), dtype) for name in "kv"}
    cache |= cfg.score.init_cache(batch, slots, dtype)
    return [dict(cache) for _ in params["layers"]]


def _target_slots(context_len, cfg, n_fed: int):
    """(B, 1 + n_fed) slots whose logits predict the targets: the last real context token (target 0),
    then the slots of the first ``n_fed`` fed tokens."""
    fed = jnp.broadcast_to(cfg.context_slots + jnp.arange(n_fed), (context_len.shape[0], n_fed))
    return jnp.concatenate([(context_len - 1)[:, None], fed], axis=1)


def decode(
    params, windows, cfg: BaselineConfig, *, train=False, rng=None, teacher_forcing=None, choose=decoding.greedy
) -> dict:
    """Free-running (or teacher-forced) decoding of S(T)+EOS with a K/V cache; free-running feeds
    ``choose(logits, j)`` (``rank4jax.models.decoding``: the greedy argmax, the paper's protocol).

    Returns logits (B, J, V) for the J = N+1 targets, the tokens fed (B, N) and the packed batch."""
    common.check_params(params, "baseline", "the baseline's decode")
    if train and cfg.dropout > 0.0 and rng is None:
        raise ValueError("decode(train=True) with dropout > 0 needs rng")
    forced = cfg.teacher_forcing if teacher_forcing is None else teacher_forcing
    packed = pack(windows, cfg)
    batch, lc = windows.shape[0], cfg.context_slots
    n_slots = lc + cfg.n_tokens
    valid = _slot_valid(packed["context_len"], cfg)
    caches = _empty_caches(params, batch, cfg)

    # prefill: the packed context in parallel, causal over slots
    causal = jnp.arange(lc)[:, None] >= jnp.arange(n_slots)[None, :]  # (Lc, S)
    key_ok = causal[None] & valid[:, None, :]
    positions = jnp.broadcast_to(jnp.arange(lc), (batch, lc))
    rng = common.window_keys(rng, batch)  # one dropout key per window
    rng_prefill = common.fold_in_keys(rng, 0)
    x = _embed(params, packed["context"], positions, cfg)
    read = _target_slots(packed["context_len"], cfg, 0)
    logits, caches = _run(params, x, caches, 0, key_ok, cfg, train=train, rng=rng_prefill, read=read)
    first = logits[:, 0]  # (B, V) at the last real context token

    def step(carry, j):
        caches, prev_logits = carry
        token = packed["targets"][:, j] if forced else choose(prev_logits, j).astype(windows.dtype)
        slot = lc + j
        x = _embed(params, token[:, None], (packed["context_len"] + j)[:, None], cfg)
        key_ok = (jnp.arange(n_slots)[None, None, :] <= slot) & valid[:, None, :]
        step_rng = common.fold_in_keys(rng, j + 1)
        logits, caches = _run(params, x, caches, slot, key_ok, cfg, train=train, rng=step_rng)
        return (caches, logits[:, 0]), (logits[:, 0], token)

    (caches, _), (step_logits, fed) = jax.lax.scan(step, (caches, first), jnp.arange(cfg.n_tokens))
    all_logits = jnp.concatenate([first[:, None], jnp.swapaxes(step_logits, 0, 1)], axis=1)
    aux = cfg.score.cached_aux(caches).astype(all_logits.dtype)
    return {"logits": all_logits, "fed": jnp.swapaxes(fed, 0, 1), "aux": aux, **packed}


def full_logits(params, packed: dict, fed: jax.Array, cfg: BaselineConfig) -> dict:
    """The cached decode's ``logits`` (B, J, V) and ``aux`` by full recomputation (no cache): the whole
    sequence of context and fed tokens in one causal pass. Used to check the cached decode."""
    batch, lc = fed.shape[0], cfg.context_slots
    n_slots = lc + cfg.n_tokens
    tokens = jnp.concatenate([packed["context"], fed], axis=1)
    positions = jnp.concatenate(
        [jnp.broadcast_to(jnp.arange(lc), (batch, lc)), packed["context_len"][:, None] + jnp.arange(cfg.n_tokens)], 1
    )
    valid = _slot_valid(packed["context_len"], cfg)
    key_ok = (jnp.arange(n_slots)[:, None] >= jnp.arange(n_slots)[None, :])[None] & valid[:, None, :]
    x = _embed(params, tokens, positions, cfg)
    read = _target_slots(packed["context_len"], cfg, cfg.n_tokens)
    logits, caches = _run(
        params, x, _empty_caches(params, batch, cfg), 0, key_ok, cfg, train=False, rng=None, read=read
    )
    return {"logits": logits, "aux": cfg.score.cached_aux(caches).astype(logits.dtype)}


def stream_logits(params, inputs: jax.Array, cfg: BaselineConfig, *, train=False, rng=None) -> jax.Array:
    """The baseline as a teacher-forced token LM: one causal pass over a packed stream (B, S) of
    BOS + tokens (``rank4jax.models.stream``), positions 0..S−1, PAD keys masked → logits (B, S, V)."""
    batch, slots = inputs.shape
    chex.assert_shape(inputs, (batch, cfg.context_slots + cfg.n_tokens))  # S = (T+1)·N + 1, the cache's slots
    common.check_params(params, "baseline", "the baseline LM")
    if train and cfg.dropout > 0.0 and rng is None:
        raise ValueError("stream_logits(train=True) with dropout > 0 needs rng")
    causal = jnp.arange(slots)[:, None] >= jnp.arange(slots)[None, :]
    key_ok = causal[None] & (inputs != PAD_ID)[:, None, :]
    x = _embed(params, inputs, jnp.broadcast_to(jnp.arange(slots), (batch, slots)), cfg)
    rng = common.window_keys(rng, batch)  # one dropout key per window
    logits, _ = _run(params, x, _empty_caches(params, batch, cfg), 0, key_ok, cfg, train=train, rng=rng)
    return logits


def _target_terms(logits: jax.Array, targets: jax.Array):
    """Per-target CE (B, J), the selection mask (S(T) and EOS) and the content mask (S(T) only)."""
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    valid = (targets != PAD_ID).astype(ce.dtype)
    content = ((targets != PAD_ID) & (targets != EOS_ID)).astype(ce.dtype)
    return ce, valid, content


def target_sums(logits: jax.Array, targets: jax.Array) -> dict:
    """Sums over targets (B, J): the selection loss covers S(T) and EOS ("window_*"); LS(T) covers
    the content tokens of S(T) only ("last_slice_*"), the same tokens as the rank-4 LS(T)."""
    return losses.target_ce_sums(logits, targets, (targets != PAD_ID) & (targets != EOS_ID))


def content_mean_ce(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """(B,) mean CE over each window's content tokens of S(T) (Story Cloze scoring)."""
    ce, _, content = _target_terms(logits, targets)
    return losses.row_mean(ce, content)


def count_params(cfg: BaselineConfig) -> int:
    """Parameter count from ``jax.eval_shape`` (nothing is allocated)."""
    return common.count_params(init_params, cfg)
