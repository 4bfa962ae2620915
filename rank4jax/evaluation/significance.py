"""Exact paired comparison of two classifiers on the same items, and a binomial interval.

``mcnemar_exact``: of the n items where exactly one of the two is right (b where only the first is, c
where only the second is), under the null each is equally likely, so b is Binomial(n, 1/2): the
two-sided p-value of the exact binomial test (``scipy.stats.binomtest``), 2·P(X ≤ min(b, c)) capped
at 1 (McNemar's exact test). Outcomes are 1 (right), 0 (wrong) or 0.5 (a tie, half right: an item
where one model ties and the other does not is half a discordance; the counts are rounded to whole
items for the test).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats


def check_outcomes(values, what: str) -> np.ndarray:
    """``values`` as a 1-D float array of outcomes 0, 0.5 or 1; a ValueError naming ``what`` otherwise."""
    if values is None:
        raise ValueError(f"{what}: no outcomes (None)")
    array = np.asarray(values, dtype=float)
    if array.ndim != 1:
        raise ValueError(f"{what}: outcomes must be one list, one per item; got shape {array.shape}")
    bad = ~np.isin(array, (0.0, 0.5, 1.0))
    if bad.any():
        raise ValueError(f"{what}: outcomes must be 1 (right), 0 (wrong) or 0.5 (a tie); item {int(np.argmax(bad))} "
                         f"is {array[np.argmax(bad)]}")  # fmt: skip
    return array


def mcnemar_exact(first_correct, second_correct) -> dict:
    """{"only_first": b, "only_second": c, "p_value"} for two outcome lists over the same items."""
    a, b = check_outcomes(first_correct, "the first"), check_outcomes(second_correct, "the second")
    if a.shape != b.shape:
        raise ValueError(f"the two outcome lists differ in length: {a.shape} and {b.shape}")
    only_first, only_second = round(float(np.sum(np.maximum(a - b, 0)))), round(float(np.sum(np.maximum(b - a, 0))))
    n = only_first + only_second
    p_value = float(stats.binomtest(only_first, n, 0.5).pvalue) if n else 1.0
    return {"only_first": only_first, "only_second": only_second, "p_value": p_value}


def wilson_interval(successes: float, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion, successes/n (ties count half, so successes
    may be a half-integer); (0, 1) with no trial."""
    if isinstance(n, bool) or not float(n).is_integer() or n < 0:
        raise ValueError(f"wilson_interval: n must be a whole number of trials, got {n!r}")
    if not (math.isfinite(successes) and 0 <= successes <= n):
        raise ValueError(f"wilson_interval: successes must be a number from 0 to n = {n}, got {successes!r}")
    if n == 0:
        return (0.0, 1.0)
    z = float(stats.norm.ppf(0.5 + confidence / 2))
    p, scale = successes / n, 1 + z * z / n
    centre = (p + z * z / (2 * n)) / scale
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / scale
    return (max(0.0, centre - half), min(1.0, centre + half))
