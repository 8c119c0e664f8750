"""Streams at start-up: create a declared stream, update one whose limits or subjects changed, refuse a conflict."""

from __future__ import annotations

import math
from typing import Any

import structlog
from nats.errors import Error as NatsError
from nats.js.api import RetentionPolicy, StreamConfig
from nats.js.errors import APIError, NotFoundError

from bastion.broker._specs import StreamSpec
from bastion.errors import ConfigError

log = structlog.get_logger("bastion.broker")


def _desired(spec: StreamSpec) -> StreamConfig:
    return StreamConfig(
        name=spec.name,
        subjects=list(spec.subjects),
        max_msgs=spec.max_messages,
        max_age=spec.max_age or None,
        retention=RetentionPolicy(spec.retention),
        num_replicas=spec.num_replicas,
    )


def _age(value: float | None) -> float:
    return float(value or 0.0)


async def ensure_stream(js: Any, spec: StreamSpec) -> str:
    """``created``, ``unchanged`` or ``updated``; ConfigError when the stream cannot be made to match."""
    desired = _desired(spec)
    try:
        info = await js.stream_info(spec.name)
    except NotFoundError:
        try:
            await js.add_stream(desired)
        except APIError as exc:
            raise ConfigError(f"broker stream {spec.name!r} cannot be created: {exc.description}") from None
        log.info("broker_stream_created", stream=spec.name, subjects=list(spec.subjects), retention=spec.retention)
        return "created"
    current = info.config
    retention = RetentionPolicy(current.retention or RetentionPolicy.LIMITS)
    if retention != desired.retention:
        raise ConfigError(
            f"broker stream {spec.name!r} exists with retention {retention.value!r}, declared "
            f"{spec.retention!r}: a stream's retention cannot change; delete the stream or change the declaration"
        )
    changes: dict[str, tuple[Any, Any]] = {}
    if sorted(current.subjects or []) != sorted(spec.subjects):
        changes["subjects"] = (current.subjects, list(spec.subjects))
    if (current.max_msgs or -1) != spec.max_messages:
        changes["max_messages"] = (current.max_msgs, spec.max_messages)
    if not math.isclose(_age(current.max_age), spec.max_age, abs_tol=1e-3):
        changes["max_age"] = (_age(current.max_age), spec.max_age)
    if spec.num_replicas is not None and (current.num_replicas or 1) != spec.num_replicas:
        changes["num_replicas"] = (current.num_replicas or 1, spec.num_replicas)
    if not changes:
        return "unchanged"
    updated = StreamConfig.from_response({**current.as_dict(), **desired.as_dict()})
    try:
        await js.update_stream(updated)
    except (APIError, NatsError) as exc:
        description = getattr(exc, "description", None) or str(exc)
        raise ConfigError(f"broker stream {spec.name!r} cannot be updated to the declaration: {description}") from None
    log.warning("broker_stream_updated", stream=spec.name, changes={k: list(v) for k, v in changes.items()})
    return "updated"
