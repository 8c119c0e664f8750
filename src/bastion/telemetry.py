"""Structured logging (structlog) and the OpenTelemetry meter Bastion records into."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog
from opentelemetry import metrics
from opentelemetry.metrics import Counter, Meter, MeterProvider

METER_NAME = "bastion"
VERSION_REQUESTS = "api.version.requests"

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure_logging(level: str = "info", fmt: str = "auto") -> None:
    """Route structlog and stdlib logging (uvicorn's too) through one renderer on stderr.

    ``fmt`` is ``json`` (production), ``console`` (development) or ``auto``: console when stderr is a
    terminal, JSON otherwise. Context variables bound per request (request id, sub, route) appear on
    every line logged while that request runs.
    """
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Any = structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            renderer,
        ],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(_LEVELS.get(level, logging.INFO))
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    # Bastion writes its own access log with masked headers; uvicorn's would duplicate it.
    logging.getLogger("uvicorn.access").disabled = True


def get_meter(provider: MeterProvider | None = None) -> Meter:
    """Bastion's meter from ``provider``, or from the global provider the operator configured."""
    if provider is not None:
        return provider.get_meter(METER_NAME)
    return metrics.get_meter(METER_NAME)


def version_counter(meter: Meter) -> Counter:
    """The ``api.version.requests`` counter (attributes: version, deprecated, replacement_version)."""
    return meter.create_counter(VERSION_REQUESTS, unit="{request}", description="Requests per API version")
