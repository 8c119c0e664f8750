"""Logging set-up for the ``bastion`` process and the OpenTelemetry meter Bastion records into."""

from __future__ import annotations

import logging

from opentelemetry import metrics
from opentelemetry.metrics import Counter, Meter, MeterProvider

from bastion_core import configure_logging as core_configure_logging

METER_NAME = "bastion"
VERSION_REQUESTS = "api.version.requests"


def configure_logging(level: str = "info", fmt: str = "auto") -> None:
    """The shared log set-up (``bastion_core.configure_logging``: JSON in production, console in development),
    with uvicorn's loggers routed through it and its access log off: Bastion writes its own, with masked
    headers."""
    core_configure_logging(level, fmt)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    logging.getLogger("uvicorn.access").disabled = True


def get_meter(provider: MeterProvider | None = None) -> Meter:
    """Bastion's meter from ``provider``, or from the global provider the operator configured."""
    if provider is not None:
        return provider.get_meter(METER_NAME)
    return metrics.get_meter(METER_NAME)


def version_counter(meter: Meter) -> Counter:
    """The ``api.version.requests`` counter (attributes: version, deprecated, replacement_version)."""
    return meter.create_counter(VERSION_REQUESTS, unit="{request}", description="Requests per API version")
