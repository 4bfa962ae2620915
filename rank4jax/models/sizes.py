"""Validation shared by every model family's frozen config (sizes of the window and the model)."""

from __future__ import annotations

import numbers

from rank4jax.errors import ConfigError

SIZE_FIELDS = ("vocab_size", "n_tokens", "n_slices", "dx", "dt", "n_heads", "n_layers")


def check_positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def check_dropout(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= float(value) < 1.0:
        raise ConfigError(f"{name} must be a number in [0, 1), got {value!r}")
    return float(value)


def section_values(section, known: set[str], name: str) -> dict:
    """A run config's sub-section (ConfigDict, mapping or None) as a plain dict; unknown keys are a
    ConfigError naming them and the section."""
    values = {} if section is None else (section.to_dict() if hasattr(section, "to_dict") else dict(section))
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"unknown {name} key(s) {unknown}; known: {sorted(known)}")
    return values


def validate_window_model(cfg) -> None:
    """Normalise and check a frozen config's sizes and dropout in place (positive integers, a
    vocabulary that holds the four special tokens, dropout in [0, 1)). Fields a family does not
    have are skipped; ``vocab_size=None`` is a config validated before the vocabulary is known."""
    for field in SIZE_FIELDS:
        if hasattr(cfg, field) and not (field == "vocab_size" and cfg.vocab_size is None):
            object.__setattr__(cfg, field, check_positive_int(field, getattr(cfg, field)))
    if cfg.vocab_size is not None and cfg.vocab_size < 4:
        raise ConfigError(f"vocab_size must be at least 4 (PAD, UNK, BOS, EOS), got {cfg.vocab_size}")
    if hasattr(cfg, "dropout"):
        object.__setattr__(cfg, "dropout", check_dropout("dropout", cfg.dropout))


def closest(candidates, count, target: int):
    """The candidate whose ``count(candidate)`` (a parameter count growing with the candidate) is
    closest to ``target``, the first on a tie: a bisection, ~log2(len) counts instead of one each."""
    lo, hi = 0, len(candidates) - 1
    while lo < hi:  # the first candidate whose count reaches the target (or the last)
        mid = (lo + hi) // 2
        if count(candidates[mid]) >= target:
            hi = mid
        else:
            lo = mid + 1
    around = [candidates[i] for i in (lo - 1, lo) if 0 <= i < len(candidates)]
    return min(around, key=lambda c: abs(count(c) - target))
