"""Validation of run configs (``configs/*.py`` → ml_collections.ConfigDict).

Every bad value raises :class:`ConfigError` naming the field; nothing is written before this passes.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import os

import ml_collections

from rank4jax.engine.batches import SETTINGS
from rank4jax.engine.sharding import mesh_shape
from rank4jax.engine.state import SCHEDULES
from rank4jax.errors import ConfigError
from rank4jax.models.family import SELECTIONS, get_family
from rank4jax.models.precision import check_compute_dtype
from rank4jax.models.sizes import check_dropout, check_positive_int

# Sections whose change makes an existing workdir's checkpoints incompatible with the run.
IDENTITY_SECTIONS = ("model_family", "model", "tokenizer", "data", "selection")
# The one source of the value a config has for a key it lacks: each key added to configs/default.py
# after runs were saved without it, with the value that reproduces what those runs did (which can
# differ from configs/default.py's value for new runs: trimming and layout timing came later). An
# older workdir resumes under them; an identity key set to another value is refused as any other
# identity change. ``complete`` (every run config, in ``validate``) and ``from_json_dict`` (every
# saved one) fill them, so the code reads every key directly.
ADDED_DEFAULTS = {
    ("selection",): "window",
    ("model", "objective_slices"): "all",
    ("model", "token_code"): "outer",
    ("model", "attention_grid"): "joint",
    ("optim", "schedule"): "constant",
    ("optim", "end_lr_factor"): 0.0,
    ("early_stop_patience",): 0,
    ("profile_steps",): "",
    ("grad_accum_steps",): 1,
    ("compute_dtype",): "float32",
    ("trim_padding_multiple",): 0,
    ("compact_buckets",): 0,
    ("batch_layout",): "rule",
}


def _check_nonnegative(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (0 <= value < math.inf):
        raise ConfigError(f"{name} must be a non-negative finite number, got {value!r}")


def complete(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Fill, in place, the keys of ``ADDED_DEFAULTS`` that ``config`` lacks (a config written before
    they existed); returns it."""
    with config.unlocked():
        for (*parents, key), default in ADDED_DEFAULTS.items():
            if parents == ["model"] and config.get("model_family") != "rank4":
                continue  # model.objective_slices, token_code, attention_grid: rank-4's only
            section = _lookup(config, parents)
            if section is not None and key not in section:
                section[key] = default
    return config


def _lookup(config, parents: tuple):
    for name in parents:
        config = config.get(name)
        if not isinstance(config, ml_collections.ConfigDict):
            return None
    return config


def validate(config: ml_collections.ConfigDict) -> None:
    """One ConfigError naming the first bad value (after ``complete``: a config without the later
    keys reads as the runs saved before them)."""
    complete(config)
    for check in (_check_model, _check_run, _check_optim, _check_data):
        check(config)


def _check_model(config: ml_collections.ConfigDict) -> None:
    family = get_family(config.model_family)
    # the family's own section: its keys only, each value checked, before any data is read (the
    # vocabulary size is only known after tokenizing)
    for name in family.fields:
        if name in ("n_tokens", "n_slices", "dx", "dt", "n_heads", "n_layers") and name in config.model:
            check_positive_int(f"model.{name}", config.model[name])
    if "dropout" in family.fields and "dropout" in config.model:
        check_dropout("model.dropout", config.model.dropout)
    family.make_config(config.model, None)


SEED_LIMIT = 2**32  # jax.random.key and numpy's generators take a seed below it


def check_seed(name: str, value) -> None:
    """A seed must be an integer in [0, 2**32)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < SEED_LIMIT:
        raise ConfigError(f"{name} must be an integer from 0 to {SEED_LIMIT - 1:,}, got {value!r}")


def _check_run(config: ml_collections.ConfigDict) -> None:
    check_seed("seed", config.seed)
    for name in ("batch_size", "eval_batch_size", "num_steps", "log_every", "eval_every", "checkpoint_every"):
        check_positive_int(name, config[name])
    check_positive_int("keep_checkpoints", config.keep_checkpoints)
    if config.selection not in SELECTIONS:
        raise ConfigError(f"selection must be one of {', '.join(SELECTIONS)}, got {config.selection!r}")
    for name in ("trim_padding_multiple", "compact_buckets", "early_stop_patience"):
        value = config[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"{name} must be a non-negative integer (0 = off), got {value!r}")
    check_positive_int("grad_accum_steps", config.grad_accum_steps)
    if config.batch_size % config.grad_accum_steps:
        raise ConfigError(
            f"batch_size ({config.batch_size}) must be a multiple of grad_accum_steps ({config.grad_accum_steps})"
        )
    check_compute_dtype(config.compute_dtype)
    traced = profile_range(config.profile_steps)
    if traced and traced[0] > config.num_steps:
        raise ConfigError(
            f"profile_steps={config.profile_steps} starts after num_steps={config.num_steps}: nothing would be traced"
        )
    if config.batch_layout not in SETTINGS:
        raise ConfigError(f"batch_layout must be one of {', '.join(SETTINGS)}, got {config.batch_layout!r}")
    if config.checkpoint_every % config.eval_every:
        raise ConfigError(
            f"checkpoint_every ({config.checkpoint_every}) must be a multiple of eval_every ({config.eval_every}) "
            "so every checkpoint carries a validation loss"
        )


def _check_optim(config: ml_collections.ConfigDict) -> None:
    optim = config.optim
    if isinstance(optim.learning_rate, bool) or not isinstance(optim.learning_rate, numbers.Real):
        raise ConfigError(f"optim.learning_rate must be a number, got {optim.learning_rate!r}")
    if not 0 < optim.learning_rate < math.inf:
        raise ConfigError(f"optim.learning_rate must be positive and finite, got {optim.learning_rate!r}")
    for name in ("weight_decay", "eps", "grad_clip_norm", "warmup_steps"):
        _check_nonnegative(f"optim.{name}", optim[name])
    if optim.schedule not in SCHEDULES:
        raise ConfigError(f"optim.schedule must be one of {', '.join(SCHEDULES)}, got {optim.schedule!r}")
    if (
        isinstance(optim.end_lr_factor, bool)
        or not isinstance(optim.end_lr_factor, numbers.Real)
        or not (0 <= optim.end_lr_factor <= 1)
    ):
        raise ConfigError(f"optim.end_lr_factor must be a number in [0, 1], got {optim.end_lr_factor!r}")
    for name in ("b1", "b2"):
        if not 0 <= optim[name] < 1:
            raise ConfigError(f"optim.{name} must be in [0, 1), got {optim[name]!r}")


def _check_data(config: ml_collections.ConfigDict) -> None:
    data = config.data
    if data.source not in ("builtin", "file"):
        raise ConfigError(f"data.source must be 'builtin' or 'file', got {data.source!r}")
    if data.source == "file" and not data.path:
        raise ConfigError("data.path must name a file when data.source='file'")
    if data.source == "builtin" and data.path:
        raise ConfigError(
            f"data.path={data.path!r} is set but data.source='builtin' (the procedural corpus) would train instead: "
            "add --config.data.source=file to train on the file, or leave data.path empty"
        )
    if data.source == "builtin":
        check_positive_int("data.builtin_stories", data.builtin_stories)
    split = tuple(data.split)
    if len(split) != 3 or any(not isinstance(f, numbers.Real) or f < 0 for f in split) or abs(sum(split) - 1) > 1e-9:
        raise ConfigError(f"data.split must be three non-negative fractions summing to 1, got {split}")
    mesh_shape(config.mesh.data, config.mesh.model)
    tok = config.tokenizer
    if tok.kind not in ("word", "sentencepiece"):
        raise ConfigError(f"tokenizer.kind must be 'word' or 'sentencepiece', got {tok.kind!r}")
    if tok.build_on not in ("train", "all"):
        raise ConfigError(f"tokenizer.build_on must be 'train' or 'all', got {tok.build_on!r}")
    check_positive_int("tokenizer.min_count", tok.min_count)
    check_positive_int("tokenizer.vocab_size", tok.vocab_size)


def profile_range(value: str) -> tuple[int, int] | None:
    """``profile_steps`` ("first:last", steps counted from 1, both traced) → (first, last); "" → None."""
    if not value:
        return None
    try:
        first, last = (int(part) for part in str(value).split(":"))
    except ValueError:
        first = last = 0
    if not 1 <= first <= last:
        raise ConfigError(f"profile_steps must be 'first:last' with 1 <= first <= last (e.g. '20:25'), got {value!r}")
    return first, last


def model_section(family_name: str, base=None, **values) -> ml_collections.ConfigDict:
    """A ``model`` section for ``family_name``: the keys of ``base`` (another family's section) that
    this family reads, then ``values``. Used by configs and experiment runners that switch family."""
    family = get_family(family_name)
    kept = {k: base[k] for k in family.fields if base is not None and k in base}
    section = ml_collections.ConfigDict(
        {k: v.to_dict() if isinstance(v, ml_collections.ConfigDict) else v for k, v in kept.items()}
    )
    for key, value in values.items():
        section[key] = value
    return section


def tokenizer_options(config: ml_collections.ConfigDict) -> dict:
    mesh_shape(config.mesh.data, config.mesh.model)
    tok = config.tokenizer
    if tok.kind == "word":
        return {"min_count": tok.min_count, "lowercase": tok.lowercase}
    return {"vocab_size": tok.vocab_size, "model_type": tok.model_type, "seed": config.seed}


def to_json_dict(config: ml_collections.ConfigDict) -> dict:
    """Plain JSON-safe dict (tuples become lists)."""
    return json.loads(config.to_json())


def identity_differences(saved: dict, config: ml_collections.ConfigDict) -> list[str]:
    """Fields in the identity sections where a saved run config differs from ``config``."""
    saved, current = with_added_defaults(saved), with_added_defaults(to_json_dict(config))
    diffs = []
    for section in IDENTITY_SECTIONS:
        a, b = saved.get(section), current.get(section)
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                if a.get(key) != b.get(key):
                    diffs.append(f"{section}.{key}: checkpoint has {a.get(key)!r}, this run has {b.get(key)!r}")
        elif a != b:
            diffs.append(f"{section}: checkpoint has {a!r}, this run has {b!r}")
    return diffs


def with_added_defaults(config: dict) -> dict:
    """A config dict with the later-added keys it lacks set to their defaults: ``complete`` on a
    ConfigDict copy, so saved and live configs are filled by the one rule."""
    return to_json_dict(complete(ml_collections.ConfigDict(config)))


FINGERPRINT_KEY = "data_fingerprint"  # beside the sections of a saved config: the data's contents


def data_fingerprint(config: ml_collections.ConfigDict) -> str | None:
    """SHA-256 of the bytes of every data file (``data.path``, comma-separated), so a resumed run can
    tell the same path with other contents; None for the built-in corpus (its config is its identity)
    or a path that is not a regular file or cannot be read (the data reader reports that: a device such
    as /dev/zero or a FIFO is never opened here, where it would be read forever)."""
    if config.data.source == "builtin":
        return None
    digest = hashlib.sha256()
    for path in (p.strip() for p in config.data.path.split(",") if p.strip()):
        if not os.path.isfile(path):  # follows links; False for devices, FIFOs, sockets and directories
            return None
        try:
            with open(path, "rb") as f:
                for block in iter(lambda f=f: f.read(1 << 20), b""):
                    digest.update(block)
        except OSError:
            return None
        digest.update(b"\0")
    return digest.hexdigest()


def from_json_dict(saved: dict) -> ml_collections.ConfigDict:
    saved = {k: v for k, v in with_added_defaults(saved).items() if k != FINGERPRINT_KEY}
    config = ml_collections.ConfigDict(saved)
    config.data.split = tuple(config.data.split)
    return config
