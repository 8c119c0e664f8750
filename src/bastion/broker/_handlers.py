"""Broker handlers written like FastAPI handlers: a typed payload parameter, optionally the message itself.

``async def on_created(event: DocumentCreated, message: BrokerMessage) -> None`` (or a plain ``def``, run in the
thread pool as FastAPI runs one): the payload is decoded and
validated from the annotation (a pydantic model, ``dict``, ``list``, ``str``, ``bytes``, any type a pydantic
``TypeAdapter`` takes); a parameter annotated :class:`BrokerMessage` gets the message (subject, headers, delivery
count), one annotated ``Broker`` gets the broker (to publish follow-up events). The signature is read once, at
registration; a payload that does not validate fails the delivery like an exception in the handler.
"""

from __future__ import annotations

import inspect
import json
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel, TypeAdapter

from bastion._callables import as_async
from bastion.errors import ConfigError

Handler = Callable[..., Any]
"""A broker handler: ``def`` or ``async def``."""


class BrokerHandle:
    """What a handler parameter annotated ``Broker`` receives (the Broker and the in-memory test broker derive
    from this; defined here so the handler layer need not import either)."""


class Publisher(Protocol):
    """What publishes on the broker: the NATS Broker, or the in-memory one of the test clients."""

    async def publish(
        self, subject: str, data: Any, *, headers: Mapping[str, str] | None = None, ack: bool = False
    ) -> int | None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerMessage:
    """One message as a handler sees it."""

    subject: str
    data: bytes
    headers: Mapping[str, str] = field(default_factory=dict)
    reply: str | None = None
    deliveries: int = 1
    """How many times JetStream has delivered it (1 on the first delivery; 1 for core messages)."""
    stream: str | None = None
    sequence: int | None = None

    @property
    def message_id(self) -> str:
        """``<stream>:<sequence>`` for a stream message, else the subject."""
        return f"{self.stream}:{self.sequence}" if self.stream is not None else self.subject

    def json(self) -> Any:
        return json.loads(self.data)


def encode(data: Any) -> bytes:
    """Bytes on the wire: a pydantic model as its JSON, bytes as they are, a str as UTF-8, anything else as JSON."""
    if isinstance(data, BaseModel):
        return data.model_dump_json().encode()
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data)
    if isinstance(data, str):
        return data.encode()
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False, default=str).encode()


def decoder(annotation: Any) -> Callable[[bytes], Any]:
    """How payload bytes become the annotated type (validated); raises on bytes that do not fit."""
    if annotation is bytes:
        return bytes
    if annotation is str:
        return lambda data: data.decode()
    if annotation is inspect.Parameter.empty or annotation is Any:
        return json.loads
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation.model_validate_json
    adapter: TypeAdapter[Any] = TypeAdapter(annotation)
    return adapter.validate_json


@dataclass(frozen=True, slots=True)
class BoundHandler:
    """A handler with its signature read: how to call it with one message."""

    func: Handler
    payload: str | None
    decode: Callable[[bytes], Any]
    message: str | None
    broker: str | None = None

    @classmethod
    def of(cls, func: Handler) -> BoundHandler:
        call = as_async(func, what="broker handler", arguments=None)
        try:
            hints = typing.get_type_hints(func)
        except NameError as exc:
            raise ConfigError(f"broker handler {func.__qualname__}: cannot resolve an annotation ({exc})") from None
        payload: str | None = None
        decode: Callable[[bytes], Any] = json.loads
        message: str | None = None
        broker: str | None = None
        for name in inspect.signature(func).parameters:
            annotation = hints.get(name, inspect.Parameter.empty)
            if annotation is BrokerMessage:
                message = name
            elif isinstance(annotation, type) and issubclass(annotation, BrokerHandle):
                broker = name
            elif payload is None:
                payload, decode = name, decoder(annotation)
            else:
                raise ConfigError(
                    f"broker handler {func.__qualname__}: one payload parameter (plus BrokerMessage and Broker "
                    f"parameters) at most, got {name!r} too"
                )
        return cls(call, payload, decode, message, broker)

    async def __call__(self, message: BrokerMessage, broker: BrokerHandle) -> Any:
        kwargs: dict[str, Any] = {}
        if self.payload is not None:
            kwargs[self.payload] = self.decode(message.data)
        if self.message is not None:
            kwargs[self.message] = message
        if self.broker is not None:
            kwargs[self.broker] = broker
        return await self.func(**kwargs)
