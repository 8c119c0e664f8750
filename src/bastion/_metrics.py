"""Metrics in Prometheus text format (``[metrics]``; docs/observability.md).

prometheus-client, not the OpenTelemetry SDK: recording one sample cost 0.5-1.3 us against 4.7-5.7 us through
the SDK here, and its multiprocess mode merges the workers of ``--workers N`` into one scrape. Names follow
OpenTelemetry's semantic conventions rendered the way OpenTelemetry's own Prometheus exporter renders them (dots
become underscores, seconds get ``_seconds``, counters ``_total``), so dashboards for either fit.

Every label value comes from a bounded set: route templates (never raw paths; no route is ``""``), the nine
standard methods (anything else is ``_OTHER``), status codes, declared names. Label children are cached on
first use (a request's by the call's arguments) and, in one process, hold plain numbers
(:mod:`bastion._metrics_local`): recording is a dict lookup and an add, no lock.

One :class:`Metrics` per app, with its own registry (several apps in one process do not mix). With
``PROMETHEUS_MULTIPROC_DIR`` set (``bastion run --workers N`` sets it), values live in files shared by the
workers and a scrape reads them all.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_PLAIN_0_0_4,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from bastion._metrics_local import LocalCounter, LocalGauge, LocalHistogram, LocalInstrument
from bastion._responses import send_response
from bastion._tracing import note
from bastion.types import Receive, Scope, Send

disable_created_metrics()  # type: ignore[no-untyped-call]  # no `_created` series beside every counter and histogram: half the lines, no loss

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"})
OTHER = "_OTHER"
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
"""OpenTelemetry's advised boundaries for ``http.server.request.duration`` (seconds)."""
BREAKER_STATES = {"closed": 0, "open": 1, "half_open": 2}


OTHER_CALLER = "other"
"""The ``caller`` of ``api_version_requests`` once ``metrics.version_callers`` distinct callers are counted."""

_INSTRUMENTS = (
    "_pending",
    "_version",
    "_duration",
    "_active",
    "_rate_limited",
    "_decisions",
    "_token_rejections",
    "_resilience",
    "_published",
    "_consumed",
    "_requests",
    "_grpc",
    "_rate_limit_events",
    "_idempotency",
)


def method_label(method: str) -> str:
    return method if method in KNOWN_METHODS else OTHER


def _version_labels(version: int, replacement: int | None) -> tuple[str, str, str]:
    """``version``, ``deprecated``, ``replacement_version`` of ``api_version_requests``."""
    if replacement is None:
        return f"v{version}", "false", ""
    return f"v{version}", "true", f"v{replacement}"


class _Children:
    """``metric.labels(*values)`` cached: prometheus-client takes a lock on every ``labels`` call."""

    __slots__ = ("_children", "_metric")

    def __init__(self, metric: Any) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], Any] = {}

    def __call__(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child


class _Nothing:
    """What an instrument of ``Metrics.off()`` is: every call records nothing."""

    def __call__(self, *values: str) -> _Nothing:
        return self

    def inc(self, amount: float = 1) -> None:
        pass

    def dec(self, amount: float = 1) -> None:
        pass

    def set(self, value: float) -> None:
        pass

    def observe(self, amount: float) -> None:
        pass


_NOTHING = _Nothing()


class Metrics:
    """The instruments of one app. ``Metrics.off()`` records nothing (``metrics.enabled = false``)."""

    def __init__(self, *, enabled: bool = True, multiprocess_dir: str | None = None, version_callers: int = 0) -> None:
        self.enabled = enabled
        self.version_callers = version_callers
        """``metrics.version_callers``: the ``caller`` label's distinct values per process (0: no such label)."""
        self._callers: set[str] = set()
        self._by_version: dict[tuple[int, int | None], Any] = {}
        self._started: dict[str, Any] = {}
        self._finished: dict[tuple[str, str, int], Any] = {}  # the children by the hot calls' arguments
        self.traced = False
        """Tracing is on: the outcomes recorded here also go on the current request's span."""
        self.registry = CollectorRegistry(auto_describe=True)
        self.multiprocess_dir = multiprocess_dir if multiprocess_dir is not None else os.environ.get(MULTIPROC_ENV)
        self._state_sources: list[Callable[[], Iterable[tuple[str, str]]]] = []
        self._store_sources: list[Callable[[], bool]] = []
        self._tls_sources: list[Callable[[], Iterable[tuple[str, float | None, int, int]]]] = []
        if not enabled:
            for name in _INSTRUMENTS:
                setattr(self, name, _NOTHING)
            return
        registry = self.registry
        counter, gauge, histogram = self._counter, self._gauge, self._histogram
        self._version = counter(
            "api_version_requests",
            "Requests per API version (api.version.requests)",
            ["version", "deprecated", "replacement_version", *(["caller"] if version_callers else [])],
        )
        self._duration = histogram(
            "http_server_request_duration_seconds",
            "Duration of HTTP server requests (http.server.request.duration)",
            ["http_request_method", "http_route", "http_response_status_code"],
        )
        self._active = gauge(
            "http_server_active_requests",
            "HTTP server requests in flight (http.server.active_requests)",
            ["http_request_method"],
            "livesum",
        )
        self._rate_limited = counter(
            "bastion_rate_limit_rejections", "Requests refused with 429, by bucket kind", ["bucket"]
        )
        self._decisions = counter("bastion_policy_decisions", "Policy decisions (cache hits included)", ["decision"])
        self._token_rejections = counter(
            "bastion_token_rejections", "Requests refused by token authentication", ["code"]
        )
        self._resilience = counter(
            "bastion_resilience_rejections",
            "Requests and calls refused by a resilience layer (503)",
            ["layer", "reason"],
        )
        self._published = counter("bastion_broker_published", "Messages published to the broker", ["acknowledged"])
        self._consumed = counter(
            "bastion_broker_consumed",
            "Messages handled by durable consumers, by outcome (ack, nak, dead_letter)",
            ["consumer", "outcome"],
        )
        self._requests = counter(
            "bastion_broker_requests",
            "Broker requests, by outcome (ok, timeout, no_responders, failed, unavailable)",
            ["outcome"],
        )
        self._grpc = histogram(
            "rpc_server_call_duration_seconds",
            "Duration of gRPC calls (rpc.server.call.duration)",
            ["rpc_system", "rpc_method", "rpc_grpc_status_code"],
        )
        self._rate_limit_events = counter(
            "bastion_rate_limit_events",
            "Rate-limit events: unknown_plan (the default limits applied), local_fallback (store down)",
            ["event"],
        )
        self._idempotency = counter(
            "bastion_idempotency_requests",
            "Requests with an Idempotency-Key, by outcome (stored, replayed, conflict, mismatch, not_stored)",
            ["outcome"],
        )
        self._pending = gauge(
            "bastion_broker_consumer_pending",
            "Messages a durable consumer's stream holds that it has not been delivered yet, as of its last "
            "delivery (JetStream's num_pending)",
            ["consumer"],
            "max",
        )
        registry.register(_BreakerStates(self._state_sources))
        registry.register(_CacheStoreUp(self._store_sources))
        registry.register(_TlsCertificates(self._tls_sources))

    @classmethod
    def off(cls) -> Metrics:
        return cls(enabled=False)

    # Without PROMETHEUS_MULTIPROC_DIR the values are plain numbers (bastion._metrics_local: no lock per add);
    # with it, prometheus-client's instruments, whose values live in the files a scrape merges.

    def _counter(self, name: str, documentation: str, labelnames: list[str]) -> Any:
        if self.multiprocess_dir:
            return _Children(Counter(name, documentation, labelnames, registry=self.registry))
        return self._local(LocalCounter(name, documentation, labelnames))

    def _gauge(self, name: str, documentation: str, labelnames: list[str], mode: Any) -> Any:
        if self.multiprocess_dir:
            return _Children(Gauge(name, documentation, labelnames, registry=self.registry, multiprocess_mode=mode))
        return self._local(LocalGauge(name, documentation, labelnames))

    def _histogram(self, name: str, documentation: str, labelnames: list[str]) -> Any:
        if self.multiprocess_dir:
            histogram = Histogram(name, documentation, labelnames, buckets=DURATION_BUCKETS, registry=self.registry)
            return _Children(histogram)
        return self._local(LocalHistogram(name, documentation, labelnames, DURATION_BUCKETS))

    def _local(self, instrument: LocalInstrument) -> LocalInstrument:
        self.registry.register(instrument)
        return instrument

    # -- recording (each a no-op when off) ----------------------------------------------------------------------

    def request_started(self, method: str) -> Any:
        """The in-flight gauge's child for ``method``, incremented; call ``.dec()`` on it when the request ends."""
        gauge = self._started.get(method)
        if gauge is None:
            gauge = self._active(method_label(method))
            if method in KNOWN_METHODS:  # only the nine as keys: a client's method is any token it likes
                self._started[method] = gauge
        gauge.inc()
        return gauge

    def request_finished(self, method: str, route: str, status: int, seconds: float) -> None:
        histogram = self._finished.get((method, route, status))  # a route template: bounded, as status codes
        if histogram is None:
            histogram = self._duration(method_label(method), route, str(status))
            if method in KNOWN_METHODS:
                self._finished[method, route, status] = histogram
        histogram.observe(seconds)

    def version_request(self, version: int, replacement: int | None, caller: str = "") -> None:
        """Count one request under ``version``; ``caller`` is used when ``version_callers`` is on (the first
        ``version_callers`` distinct callers by name, every later one as ``other``)."""
        if not self.version_callers:
            child = self._by_version.get((version, replacement))  # registered versions only: bounded
            if child is None:
                child = self._by_version[version, replacement] = self._version(*_version_labels(version, replacement))
            child.inc()
            return
        labels = _version_labels(version, replacement)
        if caller not in self._callers:
            if len(self._callers) >= self.version_callers:
                caller = OTHER_CALLER
            else:
                self._callers.add(caller)
        self._version(*labels, caller).inc()

    def rate_limited(self, bucket: str) -> None:
        self._rate_limited(bucket).inc()
        if self.traced:
            note("bastion.rate_limit.outcome", "rejected")
            note("bastion.rate_limit.bucket", bucket)

    def rate_limit_passed(self, bucket: str) -> None:
        """Only called when ``traced`` (nothing is counted for an allowed request)."""
        note("bastion.rate_limit.outcome", "allowed")
        note("bastion.rate_limit.bucket", bucket)

    def rate_limit_event(self, event: str) -> None:
        self._rate_limit_events(event).inc()

    def idempotency(self, outcome: str) -> None:
        self._idempotency(outcome).inc()
        if self.traced:
            note("bastion.idempotency.outcome", outcome)

    def policy_decision(self, decision: str) -> None:
        self._decisions(decision).inc()
        if self.traced:
            note("bastion.policy.decision", decision)

    def token_rejected(self, code: str) -> None:
        self._token_rejections(code).inc()
        if self.traced:
            note("bastion.token.outcome", code)

    def resilience_rejected(self, layer: str, reason: str) -> None:
        self._resilience(layer, reason).inc()
        if self.traced:
            note("bastion.resilience.rejected", f"{layer}:{reason}")

    def broker_published(self, *, acknowledged: bool) -> None:
        self._published("true" if acknowledged else "false").inc()

    def broker_consumed(self, consumer: str, outcome: str) -> None:
        self._consumed(consumer, outcome).inc()
        if self.traced:
            note("bastion.broker.outcome", outcome)

    def broker_pending(self, consumer: str, pending: int) -> None:
        """The consumer's lag: what its stream still holds for it, read from the message just delivered."""
        self._pending(consumer).set(pending)

    def broker_request(self, outcome: str) -> None:
        self._requests(outcome).inc()

    def grpc_call(self, method: str, status: int, seconds: float) -> None:
        self._grpc("grpc", method, str(status)).observe(seconds)

    def watch_tls(self, source: Callable[[], Iterable[tuple[str, float | None, int, int]]]) -> None:
        """``source()`` gives ``(port, seconds until expiry, reloads, refused reloads)``, read at each scrape."""
        if self.enabled:
            self._tls_sources.append(source)

    def watch_breakers(self, source: Callable[[], Iterable[tuple[str, str]]]) -> None:
        """``source()`` gives ``(breaker name, state)`` pairs, read at each scrape (no per-request cost)."""
        if self.enabled:
            self._state_sources.append(source)

    def watch_cache_store(self, source: Callable[[], bool]) -> None:
        """``source()`` says whether the Redis/Valkey cache store answered its last operation, read at each scrape."""
        if self.enabled:
            self._store_sources.append(source)

    # -- exposition ---------------------------------------------------------------------------------------------

    def exposition(self) -> bytes:
        """The Prometheus text of every metric (merged across worker processes in multiprocess mode)."""
        if self.multiprocess_dir:
            merged = CollectorRegistry()
            MultiProcessCollector(merged, path=self.multiprocess_dir)  # type: ignore[no-untyped-call]
            merged.register(_BreakerStates(self._state_sources))
            merged.register(_CacheStoreUp(self._store_sources))
            merged.register(_TlsCertificates(self._tls_sources))
            return generate_latest(merged)
        return generate_latest(self.registry)

    content_type = CONTENT_TYPE_PLAIN_0_0_4
    """Text format 0.0.4, what every scraper reads (prometheus-client's CONTENT_TYPE_LATEST names 1.0.0 since 0.22;
    the body is the same for our names)."""

    def close(self) -> None:
        """At shutdown: in multiprocess mode, drop this worker's in-flight gauge so a scrape no longer counts it."""
        if self.enabled and self.multiprocess_dir:
            mark_process_dead(os.getpid(), self.multiprocess_dir)  # type: ignore[no-untyped-call]


def multiprocess_exposition(path: str) -> Callable[[], bytes]:
    """The merged exposition of every worker writing into ``path`` (the supervisor of ``--workers N``)."""

    def expose() -> bytes:
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=path)  # type: ignore[no-untyped-call]
        return generate_latest(registry)

    return expose


class _BreakerStates:
    """``bastion_circuit_breaker_state{breaker}``: 0 closed, 1 open, 2 half-open, read when scraped."""

    def __init__(self, sources: list[Callable[[], Iterable[tuple[str, str]]]]) -> None:
        self.sources = sources

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterable[Any]:
        family = GaugeMetricFamily(
            "bastion_circuit_breaker_state", "Circuit breaker state: 0 closed, 1 open, 2 half-open", labels=["breaker"]
        )
        for source in self.sources:
            for name, state in source():
                family.add_metric([name], BREAKER_STATES.get(state, 0))
        yield family


class _TlsCertificates:
    """``bastion_tls_certificate_expiry_seconds{port}`` and ``bastion_tls_reloads_total{port,outcome}``, read when
    scraped from the reloading TLS contexts."""

    def __init__(self, sources: list[Callable[[], Iterable[tuple[str, float | None, int, int]]]]) -> None:
        self.sources = sources

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterable[Any]:
        expiry = GaugeMetricFamily(
            "bastion_tls_certificate_expiry_seconds", "Seconds until the served certificate expires", labels=["port"]
        )
        reloads = CounterMetricFamily(
            "bastion_tls_reloads", "TLS certificate set reloads by outcome", labels=["port", "outcome"]
        )
        for source in self.sources:
            for port, seconds, done, refused in source():
                if seconds is not None:
                    expiry.add_metric([port], seconds)
                reloads.add_metric([port, "success"], done)
                reloads.add_metric([port, "failure"], refused)
        yield expiry
        yield reloads


class _CacheStoreUp:
    """``bastion_cache_store_up``: 1 while the cache store answers, 0 after a failed operation; only with
    ``cache_store.url`` (the in-process store cannot fail)."""

    def __init__(self, sources: list[Callable[[], bool]]) -> None:
        self.sources = sources

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterable[Any]:
        if self.sources:
            up = all(source() for source in self.sources)
            yield GaugeMetricFamily("bastion_cache_store_up", "1 while the cache store answers, else 0", value=int(up))


NO_METRICS = Metrics.off()
"""What a capability records into when its app has metrics off (or it is built outside an app)."""


async def serve_metrics(metrics: Metrics, scope: Scope, receive: Receive, send: Send) -> None:
    """The metrics endpoint: ``GET``/``HEAD`` -> 200 with the Prometheus text; other methods 405."""
    method = scope.get("method")
    if method != "GET" and method != "HEAD":
        await send_response(send, 405, [(b"allow", b"GET, HEAD"), (b"content-length", b"0")], b"")
        return
    body = metrics.exposition()
    headers = [(b"content-type", metrics.content_type.encode()), (b"content-length", str(len(body)).encode())]
    await send_response(send, 200, headers, body, head=method == "HEAD")
