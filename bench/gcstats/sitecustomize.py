"""Garbage-collector time of a benchmarked server: on ``PYTHONPATH`` with ``BENCH_GC_STATS=<prefix>`` set, the
process writes ``<seconds in collections> <collections of generation 0> <1> <2>`` to ``<prefix><pid>`` after each
collection of generation 1 or 2 (about every 10 young ones: a few hundred requests apart), so a benchmark reads how
much of the server's CPU went to the collector (``python -m bench.idempotency_ab --gc``; issue 32)."""

from __future__ import annotations

import gc
import os
import time
from typing import Any

_PREFIX = os.environ.get("BENCH_GC_STATS")
_spent = [0.0, 0.0]  # seconds in collections so far, start of the current one
_counts = [0, 0, 0]


def _callback(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _spent[1] = time.perf_counter()
        return
    _spent[0] += time.perf_counter() - _spent[1]
    generation = info["generation"]
    _counts[generation] += 1
    if generation:
        with open(f"{_PREFIX}{os.getpid()}", "w") as out:
            out.write(f"{_spent[0]:.6f} {_counts[0]} {_counts[1]} {_counts[2]}\n")


if _PREFIX:
    gc.callbacks.append(_callback)
