"""What the service reports: ``[audit]`` events, ``[metrics]`` and ``[tracing]`` (docs/observability.md)."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field, field_validator

from bastion.config._values import Bool, PositiveDuration, PositiveInt, Section, check_subject


class AuditSettings(Section):
    """``[audit]``: audit events to the log and, when a broker is configured, to the broker."""

    enabled: Bool = True
    audit_auth_events: Bool = True
    broker_subject_prefix: str = "bastion.audit"
    broker_buffer: PositiveInt = 1000

    @field_validator("broker_subject_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        return check_subject(value, wildcards=False)


DEFAULT_OTLP_ENDPOINT = "http://127.0.0.1:4318/v1/traces"
MAX_VERSION_CALLERS = 10_000
"""The largest ``metrics.version_callers``: each caller is a series per version a scraper stores."""


class MetricsSettings(Section):
    """``[metrics]``: Prometheus metrics (docs/observability.md)."""

    enabled: Bool = True
    path: str = "/metrics"
    public: Bool = True
    """``true``: the main port answers ``path`` before token auth, rate limiting and policy. ``false``: it is
    an ordinary route behind them (a policy must permit ``GET <path>``)."""
    port: Annotated[int, Field(ge=1, le=65535)] | None = None
    """Serve the metrics on this port of ``service.host`` instead of the main port (``bastion run``)."""
    version_callers: Annotated[int, Field(ge=0, le=MAX_VERSION_CALLERS)] = 0
    """``api_version_requests`` by caller (``caller`` label: the token's ``client_id``, else a hash of its ``sub``):
    at most this many callers per process, the others counted as ``other``; ``0``: no ``caller`` label."""

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        if not re.fullmatch(r"/[A-Za-z0-9._~/-]*", value) or "//" in value:
            raise ValueError("expected an absolute path such as /metrics")
        return value


class TracingSettings(Section):
    """``[tracing]``: OpenTelemetry traces exported over OTLP/HTTP (docs/observability.md). Off unless
    ``enabled = true`` or an ``endpoint`` is set (and no ``enabled = false``)."""

    enabled: Bool | None = None
    endpoint: str = DEFAULT_OTLP_ENDPOINT
    """The collector's OTLP/HTTP traces URL (protobuf), e.g. ``http://otel-collector:4318/v1/traces``."""
    sampling_ratio: Annotated[float, Field(ge=0.0, le=1.0)] = 1.0
    """The share of new traces recorded; a caller's ``traceparent`` decides for the traces it starts."""
    export_timeout_secs: PositiveDuration = 10.0

    @property
    def active(self) -> bool:
        return self.enabled is True or (self.enabled is None and "endpoint" in self.model_fields_set)

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        if not re.fullmatch(r"https?://[^\s/?#]+(/[^\s]*)?", value):
            raise ValueError("expected an http:// or https:// URL such as http://127.0.0.1:4318/v1/traces")
        return value
