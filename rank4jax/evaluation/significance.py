"""Exact paired comparison of two classifiers on the same items, and a binomial interval, by
``scipy.stats``.

``mcnemar_exact``: of the n items where exactly one of the two is right (b where only the first is, c
where only the second is), under the null each is equally likely, so b is Binomial(n, 1/2): the
two-sided p-value of the exact binomial test, 2·P(X ≤ min(b, c)) capped at 1 (McNemar's exact test).
"""

from __future__ import annotations

import numpy as np
from scipy import stats


def mcnemar_exact(first_correct, second_correct) -> dict:
    """{"only_first": b, "only_second": c, "p_value"} for two 0/1 sequences over the same items."""
    a, b = np.asarray(first_correct, bool), np.asarray(second_correct, bool)
    if a.shape != b.shape:
        raise ValueError(f"the two outcome lists differ in length: {a.shape} and {b.shape}")
    only_first, only_second = int(np.sum(a & ~b)), int(np.sum(~a & b))
    n = only_first + only_second
    p_value = float(stats.binomtest(only_first, n, 0.5).pvalue) if n else 1.0
    return {"only_first": only_first, "only_second": only_second, "p_value": p_value}


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (``binomtest(...).proportion_ci``); (0, 1)
    with no trial."""
    if n == 0:
        return (0.0, 1.0)
    interval = stats.binomtest(int(successes), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    return (float(interval.low), float(interval.high))
