"""Instruments of one process: counters, gauges and histograms whose values are plain numbers (docs/observability.md).

prometheus-client guards every value with a lock and checks its arguments on every ``inc`` and ``observe``:
a request recorded four to six of them (the active-requests gauge up and down, the duration histogram's sum and
bucket, the version and policy-decision counters), about 8 % of a secured request's CPU. A request records from
the event loop's one thread, so here a value is an attribute added to, and a collector of the registry turns the
values into the same families prometheus-client's own ``Counter``, ``Gauge`` and ``Histogram`` produce (names,
help, label order, bucket bounds, values: the exposition is byte for byte the same, which
``tests/bastion/test_metrics_local.py`` checks against prometheus-client's). A scrape on ``metrics.port``'s
thread reads copies (``dict.copy`` and ``list`` of a list hold the GIL), as prometheus-client's do.

Only without ``PROMETHEUS_MULTIPROC_DIR``: in multiprocess mode (``--workers N``) each value lives in the files
a scrape merges, and :mod:`bastion._metrics` keeps prometheus-client's instruments.

Each instrument is also its own label cache: ``instrument(*values)`` is the child for those label values,
created at first use (the values come from bounded sets, module docstring of :mod:`bastion._metrics`).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.utils import INF, floatToGoString


class _Value:
    """A counter's or gauge's child: one number."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        self.value += amount

    def dec(self, amount: float = 1) -> None:
        self.value -= amount

    def set(self, value: float) -> None:
        self.value = float(value)


class _Buckets:
    """A histogram's child: the observations per bucket (not cumulative) and their sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0

    def observe(self, amount: float) -> None:
        self.sum += amount
        self.counts[bisect_left(self.bounds, amount)] += 1  # the first bucket with amount <= bound (+Inf last)


class LocalInstrument:
    """A labelled instrument registered as a collector; ``instrument(*values)`` is the child for those values."""

    kind = ""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], Any] = {}

    def __call__(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name}: {len(self.labelnames)} label values expected, got {len(values)}")
            child = self._children[values] = self._child()
        return child

    def _child(self) -> Any:
        return _Value()

    def describe(self) -> list[Metric]:
        return [Metric(self.name, self.documentation, self.kind)]

    def collect(self) -> list[Metric]:
        metric = Metric(self.name, self.documentation, self.kind)
        for values, child in self._children.copy().items():
            labels = dict(zip(self.labelnames, values, strict=True))
            self._samples(metric, labels, child)
        return [metric]

    def _samples(self, metric: Metric, labels: dict[str, str], child: Any) -> None:
        metric.add_sample(self.name, labels, child.value)


class LocalCounter(LocalInstrument):
    kind = "counter"

    def _samples(self, metric: Metric, labels: dict[str, str], child: Any) -> None:
        metric.add_sample(self.name + "_total", labels, child.value)


class LocalGauge(LocalInstrument):
    kind = "gauge"


class LocalHistogram(LocalInstrument):
    kind = "histogram"

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], buckets: Iterable[float]) -> None:
        super().__init__(name, documentation, labelnames)
        self.bounds = (*(float(bound) for bound in buckets), INF)
        self._les = tuple(floatToGoString(bound) for bound in self.bounds)  # type: ignore[no-untyped-call]

    def _child(self) -> Any:
        return _Buckets(self.bounds)

    def _samples(self, metric: Metric, labels: dict[str, str], child: Any) -> None:
        cumulative = 0.0
        for le, count in zip(self._les, list(child.counts), strict=True):
            cumulative += count
            metric.add_sample(self.name + "_bucket", {**labels, "le": le}, cumulative)
        metric.add_sample(self.name + "_count", labels, cumulative)
        metric.add_sample(self.name + "_sum", labels, child.sum)
