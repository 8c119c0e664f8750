"""The in-process instruments (bastion._metrics_local) expose exactly what prometheus-client's own do: the same
calls recorded into ``Metrics()`` (plain numbers) and into ``Metrics`` with prometheus-client's instruments (what
multiprocess mode builds; without ``PROMETHEUS_MULTIPROC_DIR`` at import their values are in memory) give the
same bytes of Prometheus text."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from bastion._metrics import DURATION_BUCKETS, Metrics
from bastion._metrics_local import LocalCounter

METHODS = ["GET", "POST", "BREW", "DELETE", "get"]
ROUTES = ["/api/v1/items", "/api/v1/items/{item_id}", "", '/odd/"quoted"\\path\n']
STATUSES = [200, 201, 401, 404, 429, 500]
EDGES = [0.0, *DURATION_BUCKETS, 1e-9, 0.0050000001, 10.000001, 3600.0]


def record(metrics: Metrics, seed: int) -> None:
    """The same few hundred recordings, every instrument, label values and durations on the bucket bounds."""
    rng = random.Random(seed)
    active = [metrics.request_started(rng.choice(METHODS)) for _ in range(7)]
    for gauge in active[:4]:
        gauge.dec()
    for index in range(300):
        seconds = EDGES[index % len(EDGES)] if index % 3 else rng.uniform(0, 12)
        metrics.request_finished(rng.choice(METHODS), rng.choice(ROUTES), rng.choice(STATUSES), seconds)
        metrics.grpc_call(rng.choice(["/pkg.S/A", "/pkg.S/B"]), rng.randrange(17), seconds)
        metrics.version_request(rng.choice([1, 2]), rng.choice([None, 2]), rng.choice(["client:a", "anonymous"]))
    for _ in range(20):
        metrics.rate_limited(rng.choice(["user", "ip"]))
        metrics.rate_limit_event(rng.choice(["unknown_plan", "local_fallback"]))
        metrics.policy_decision(rng.choice(["allow", "deny", "error"]))
        metrics.token_rejected(rng.choice(["UNAUTHORIZED", "TOKEN_EXPIRED"]))
        metrics.resilience_rejected("orders", rng.choice(["circuit_open", "bulkhead_full"]))
        metrics.broker_published(acknowledged=rng.random() < 0.5)
        metrics.broker_consumed("worker", rng.choice(["ack", "nak", "dead_letter"]))
        metrics.broker_pending("worker", rng.randrange(100))
        metrics.broker_request(rng.choice(["ok", "timeout"]))
        metrics.idempotency(rng.choice(["stored", "replayed"]))
    metrics.watch_breakers(lambda: [("orders", "open")])


@pytest.mark.parametrize("version_callers", [0, 1])
@pytest.mark.parametrize("seed", [None, 1, 2])
def test_exposition_is_byte_for_byte_prometheus_clients(tmp_path: Path, seed: int | None, version_callers: int) -> None:
    local = Metrics(version_callers=version_callers)
    reference = Metrics(version_callers=version_callers, multiprocess_dir=str(tmp_path))
    if seed is not None:  # None: nothing recorded, every family's HELP and TYPE lines alone
        record(local, seed)
        record(reference, seed)
    assert local.exposition() == generate_latest(reference.registry)


def test_a_wrong_number_of_label_values_is_refused() -> None:
    counter = LocalCounter("things", "Things", ["kind"])
    with pytest.raises(ValueError, match="1 label values expected, got 2"):
        counter("a", "b")
