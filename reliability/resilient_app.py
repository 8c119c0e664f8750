"""The `client-errors` scenario's service: the documents example with a circuit breaker over every route and gRPC
method, set to open at once if client errors counted as failures (more than half of the last 4 outcomes).

Run: ``bastion run reliability.resilient_app:service --config examples/documents_api/config.toml``.
"""

from __future__ import annotations

from examples.documents_api import create_service
from examples.documents_api.store import seeded_store
from reliability.client_errors import BREAKER

service = create_service(seeded_store())
service.use_resilience(name=BREAKER, min_requests=4, threshold=0.5, wait_secs=60)
