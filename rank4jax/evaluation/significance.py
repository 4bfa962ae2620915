"""Exact paired comparison of two classifiers on the same items, and a binomial interval.

``mcnemar_exact``: of the n items where exactly one of the two is right (b where only the first is, c
where only the second is), under the null each is equally likely, so min(b, c) is Binomial(n, 1/2):
the two-sided p-value is 2·P(X ≤ min(b, c)), capped at 1 (McNemar's exact test).
"""

from __future__ import annotations

import math

import numpy as np


def mcnemar_exact(first_correct, second_correct) -> dict:
    """{"only_first": b, "only_second": c, "p_value"} for two 0/1 sequences over the same items."""
    a, b = np.asarray(first_correct, bool), np.asarray(second_correct, bool)
    if a.shape != b.shape:
        raise ValueError(f"the two outcome lists differ in length: {a.shape} and {b.shape}")
    only_first, only_second = int(np.sum(a & ~b)), int(np.sum(~a & b))
    n, k = only_first + only_second, min(only_first, only_second)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n if n else 1.0
    return {"only_first": only_first, "only_second": only_second, "p_value": min(1.0, 2 * tail)}


def wilson_interval(successes: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """The 95 % Wilson score interval of a binomial proportion (z for another level)."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (centre - half, centre + half)
