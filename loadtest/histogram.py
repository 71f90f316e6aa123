"""Latency histograms as locust keeps them: {latency in ms: count}."""
from __future__ import annotations

import math


def bucket_ms(latency_ms: float) -> float:
    """Round a latency to 3 significant digits.

    Replaces locust's default (2 digits: 10 ms steps between 100 and 999 ms, 1 ms below
    100 ms) whose 5-10 % steps are too coarse to compare serving configurations.
    """
    if latency_ms <= 0:
        return 0.0
    digits = 2 - math.floor(math.log10(latency_ms))
    return float(round(latency_ms, digits))


def percentile(histogram: dict[float, int], q: float) -> float:
    """Nearest-rank percentile: the smallest latency with at least q of all requests at or below it.

    q is a fraction in [0, 1]; q=0 gives the minimum. NaN for an empty histogram.
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be a fraction in [0, 1], got {q}")
    total = sum(histogram.values())
    if total == 0:
        return math.nan
    rank = max(1, math.ceil(q * total))
    seen = 0
    for latency in sorted(histogram):
        seen += histogram[latency]
        if seen >= rank:
            return float(latency)
    raise AssertionError("unreachable: rank <= total")
