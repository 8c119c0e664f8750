"""The broker's settings: ``[broker]`` and its ``[broker.streams.<NAME>]`` tables (docs/broker.md)."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, SecretStr, field_validator, model_validator

from bastion.config._values import Bool, Duration, PositiveDuration, Section, check_subject

RETENTIONS = {"limits": "limits", "interest": "interest", "workqueue": "workqueue", "work_queue": "workqueue"}


def _retention(value: object) -> object:
    if isinstance(value, str):
        retention = RETENTIONS.get(value.strip().lower())
        if retention is None:
            raise ValueError("expected one of Limits, Interest, WorkQueue")
        return retention
    return value


MAX_REPLICAS = 5
"""JetStream's largest replica count."""


class StreamSettings(Section):
    """``[broker.streams.<NAME>]``: a JetStream stream, created (or updated) at start-up."""

    subjects: list[str]
    max_messages: Annotated[int, Field(ge=-1)] = -1
    max_age: Duration = 0.0
    retention: Annotated[Literal["limits", "interest", "workqueue"], BeforeValidator(_retention)] = "limits"
    num_replicas: Annotated[int, Field(ge=1, le=MAX_REPLICAS)] | None = None

    @field_validator("subjects")
    @classmethod
    def _subjects(cls, subjects: list[str]) -> list[str]:
        if not subjects:
            raise ValueError("a stream needs at least one subject")
        return [check_subject(subject, wildcards=True) for subject in subjects]


class BrokerSettings(Section):
    """``[broker]``: NATS JetStream; on when ``url`` is set (or ``SERVICE_BROKER_URL``) unless ``enabled = false``."""

    enabled: Bool | None = None
    url: SecretStr | None = None
    name: str | None = None
    max_reconnects: Annotated[int, Field(ge=-1)] = 60
    max_retries: Annotated[int, Field(ge=0)] = 3
    retry_delay_secs: Annotated[int, Field(ge=0)] = 1
    optional: Bool = False
    lazy_init: Bool = True
    connect_timeout_secs: PositiveDuration = 2.0
    drain_timeout_secs: PositiveDuration = 10.0
    dead_letter_prefix: str = "deadletter"
    streams: dict[str, StreamSettings] = Field(default_factory=dict)
    tls_ca_path: str | None = None
    """``tls://`` URLs: the CAs the NATS server's certificate must chain to (default: the system's)."""
    tls_cert_path: str | None = None
    """``tls://`` URLs: the client certificate presented to a NATS server with TLS client auth (re-read when it
    changes: looked at every 10 seconds)."""
    tls_key_path: str | None = None

    @model_validator(mode="after")
    def _tls_pair(self) -> BrokerSettings:
        if (self.tls_cert_path is None) != (self.tls_key_path is None):
            raise ValueError("broker.tls_cert_path and broker.tls_key_path must be set together")
        return self

    @field_validator("dead_letter_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        return check_subject(value, wildcards=False)

    @field_validator("streams")
    @classmethod
    def _stream_names(cls, streams: dict[str, StreamSettings]) -> dict[str, StreamSettings]:
        for name in streams:
            if not re.fullmatch(r"[A-Za-z0-9_-]+", name):
                raise ValueError(f"stream name {name!r}: letters, digits, '-' and '_' only")
        return streams

    @property
    def active(self) -> bool:
        return self.enabled is not False and self.url is not None

    @field_validator("url")
    @classmethod
    def _scheme(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return value
        for part in value.get_secret_value().split(","):
            if not re.match(r"^(nats|tls|ws|wss)://[^\s/]+$", part.strip()):
                raise ValueError("expected nats://host:port (comma-separated for a cluster, tls:// for TLS)")
        return value

    @model_validator(mode="after")
    def _url_when_enabled(self) -> BrokerSettings:
        if self.enabled and self.url is None:
            raise ValueError("broker.enabled is true but broker.url is not set")
        return self
