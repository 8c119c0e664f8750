"""Percentiles and spreads, without numpy."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def percentile(ordered: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of an already sorted sequence; ``nan`` when it is empty."""
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(round(pct * len(ordered) / 100, 9)))  # rounded: 99.9 % of 2000 is rank 1998, not 1999
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def spread_pct(values: Sequence[float]) -> float:
    """(max - min) / median, in percent: how far apart the rounds of one row landed."""
    if len(values) < 2:
        return 0.0
    mid = statistics.median(values)
    return (max(values) - min(values)) / mid * 100 if mid else math.nan


def load_result(latencies: Sequence[float], *, seconds: float, non_2xx: int, errors: int) -> dict[str, float]:
    """The JSON line every load generator prints: counts, elapsed seconds, and p50, p99, p99.9 and the slowest
    request in milliseconds."""
    ordered = sorted(latencies)
    return {
        "requests": len(ordered),
        "seconds": seconds,
        "non_2xx": non_2xx,
        "errors": errors,
        "p50_ms": percentile(ordered, 50) * 1e3,
        "p99_ms": percentile(ordered, 99) * 1e3,
        "p999_ms": percentile(ordered, 99.9) * 1e3,
        "max_ms": (ordered[-1] if ordered else math.nan) * 1e3,
    }
