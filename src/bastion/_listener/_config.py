"""What the listener's protocols read from the ``[service]`` settings, carried on uvicorn's Config."""

from __future__ import annotations

from dataclasses import dataclass

from uvicorn.config import Config

from bastion._connections import ConnectionSlots
from bastion._tls import port_alpn, server_tls
from bastion.config import ServiceSettings, Settings


@dataclass(frozen=True, slots=True, kw_only=True)
class ListenerLimits:
    """What one connection may make the process hold: the ``[service]`` listener keys the protocols read.

    ``keep_alive_timeout_secs`` is not here: it is uvicorn's own ``timeout_keep_alive``.
    """

    max_header_bytes: int
    max_headers: int
    header_read_timeout_secs: float
    max_connections: int
    max_connections_per_ip: int
    max_pipelined_requests: int

    @classmethod
    def from_settings(cls, service: ServiceSettings) -> ListenerLimits:
        return cls(
            max_header_bytes=service.max_header_bytes,
            max_headers=service.max_headers,
            header_read_timeout_secs=service.header_read_timeout_secs,
            max_connections=service.max_connections,
            max_connections_per_ip=service.max_connections_per_ip,
            max_pipelined_requests=service.max_pipelined_requests,
        )


DEFAULT_LIMITS = ListenerLimits.from_settings(ServiceSettings())


class ListenerConfig(Config):
    """uvicorn's Config, with ALPN ``h2``/``http/1.1`` offered on TLS when gRPC shares the port.

    ``limits`` carries the listener limits to the protocols uvicorn builds from it; ``slots`` counts the port's
    connections against them, one per process (``--workers N``: each worker unpickles its own config, and makes
    its slots at its first connection).
    """

    alpn_h2 = False
    limits = DEFAULT_LIMITS
    tls_settings: Settings | None = None
    """With TLS on: the settings the port's reloading context is built from (``bastion._tls.server_tls``)."""
    identity_from: tuple[str, ...] | None = None
    """With ``tls.client_auth`` on: where a client certificate's identity is read (the protocols put it in the
    scope)."""
    _slots: ConnectionSlots | None = None

    @property
    def slots(self) -> ConnectionSlots:
        if self._slots is None:
            self._slots = ConnectionSlots(self.limits.max_connections, self.limits.max_connections_per_ip)
        return self._slots

    def load(self) -> None:
        super().load()
        if self.ssl is None:
            return
        tls = server_tls(self.tls_settings, alpn=port_alpn(self.tls_settings)) if self.tls_settings else None
        if tls is not None:
            # Each handshake is switched to the last good certificate set (rotation without a restart).
            self.ssl = tls.front
        else:
            self.ssl.set_alpn_protocols(["h2", "http/1.1"] if self.alpn_h2 else ["http/1.1"])


def identity_of(config: Config) -> tuple[str, ...] | None:
    return config.identity_from if isinstance(config, ListenerConfig) else None


def limits_of(config: Config) -> ListenerLimits:
    return config.limits if isinstance(config, ListenerConfig) else DEFAULT_LIMITS


def slots_of(config: Config) -> ConnectionSlots:
    """The port's connection slots. A plain uvicorn Config (not built by ``uvicorn_config``) counts nothing: each
    connection gets slots of its own."""
    if isinstance(config, ListenerConfig):
        return config.slots
    return ConnectionSlots(DEFAULT_LIMITS.max_connections)
