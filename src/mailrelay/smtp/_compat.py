"""aiosmtpd internals MailRelay relies on (verified on aiosmtpd 1.4.6, Python 3.11; `make compat`: 1.4.5, 1.4.4).

``RelaySMTP`` keeps aiosmtpd's transport plumbing (the stream reader and writer, the idle timer, the STARTTLS
transport switch) and replaces its command loop. :class:`SmtpTransport` is the one place that reaches into
aiosmtpd's ``SMTP`` for that, and gives ``RelaySMTP`` public names instead:

- ``SMTP._reader`` / ``SMTP._writer``: the connection's ``asyncio.StreamReader`` / ``StreamWriter`` (set when the
  connection is made).
- ``SMTP._tls_protocol``: the ``SSLProtocol`` after STARTTLS, ``None`` before.
- ``SMTP._original_transport``: the plain transport under TLS after STARTTLS, ``None`` before; ``connection_made``
  runs again once the TLS handshake is done, with both set.
- ``SMTP._timeout_duration``: the idle timeout the protocol was built with.
- ``SMTP._reset_timeout(duration=None)``: (re)starts the idle timer, which calls ``_timeout_cb`` when it fires.
- ``SMTP._timeout_cb()``: what the idle timer calls (aiosmtpd closes the transport): :meth:`on_idle_timeout`.
- ``SMTP._handle_client()``: the command loop, started as a task by ``connection_made``: :meth:`serve_commands`.
- ``asyncio.sslproto.SSLProtocol._app_transport`` (the standard library's): the TLS side of the switched
  connection, as aiosmtpd's ``smtp_STARTTLS`` uses it.

``missing()`` lists what the installed aiosmtpd lacks; ``check()`` refuses start-up (``ConfigError``, one line
naming the supported versions): the session limits depend on these. ``tests/mailrelay/smtp/test_compat.py``
checks each assumption.
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto as sslproto
import importlib.metadata
import inspect

from aiosmtpd.smtp import SMTP

from bastion_core import ConfigError

VERIFIED = "aiosmtpd 1.4.6"
"""The aiosmtpd version these assumptions were last checked on."""
SUPPORTED = "aiosmtpd 1.4.4 to 1.4.x"
"""The range pyproject.toml declares (`make compat` runs its oldest release)."""
METHODS = ("_reset_timeout", "_timeout_cb", "_handle_client")
ATTRIBUTES = ("_reader", "_writer", "_tls_protocol", "_original_transport", "_timeout_duration")
PRIVATE_NAMES = frozenset({*METHODS, *ATTRIBUTES})
"""Every private name of aiosmtpd this module touches (the wall test looks for them outside the compat modules; the
standard library's ``_app_transport`` is not one of the walled libraries)."""


def version() -> str:
    """The installed aiosmtpd's version."""
    return importlib.metadata.version("aiosmtpd")


def missing() -> list[str]:
    """The internals the installed aiosmtpd lacks (``[]``: none)."""
    absent = [f"SMTP.{name}" for name in METHODS if not callable(getattr(SMTP, name, None))]
    source = inspect.getsource(SMTP)
    absent += [f"SMTP.{name}" for name in ATTRIBUTES if f"self.{name}" not in source]
    if "_app_transport" not in inspect.getsource(sslproto.SSLProtocol):
        absent.append("asyncio.sslproto.SSLProtocol._app_transport")
    return absent


def check() -> None:
    """Raise ConfigError (one line) when the installed aiosmtpd lacks an internal the SMTP server needs."""
    absent = missing()
    if absent:
        raise ConfigError(
            f"aiosmtpd {version()} lacks what MailRelay's SMTP server relies on ({', '.join(absent)}); "
            f"supported: {SUPPORTED}"
        )


class SmtpTransport(SMTP):
    """aiosmtpd's ``SMTP`` protocol reduced to its transport plumbing, under public names.

    Subclasses implement :meth:`serve_commands` (the command loop, started when the connection is made) and may
    override :meth:`on_idle_timeout` (the idle timer fired; aiosmtpd closes the transport).
    """

    @property
    def reader(self) -> asyncio.StreamReader:
        """The connection's input."""
        return self._reader

    @property
    def writer(self) -> asyncio.StreamWriter:
        """The connection's output."""
        return self._writer

    @property
    def tls_active(self) -> bool:
        """Whether STARTTLS has switched the connection to TLS."""
        return self._tls_protocol is not None

    @property
    def plain_transport(self) -> asyncio.BaseTransport | None:
        """The plain transport under TLS after STARTTLS (``None`` before)."""
        return self._original_transport

    @property
    def idle_timeout(self) -> float:
        """The idle timeout the protocol was built with, in seconds."""
        timeout: float = self._timeout_duration
        return timeout

    def restart_idle_timer(self, duration: float | None = None) -> None:
        """(Re)start the idle timer: :meth:`on_idle_timeout` runs after ``duration`` (default ``idle_timeout``)."""
        self._reset_timeout(duration)

    def start_tls(self, context: object) -> asyncio.Future[None]:
        """Switch the connection to TLS as aiosmtpd's ``smtp_STARTTLS`` does; the future completes when the
        handshake does (then ``connection_made`` runs again, with :attr:`plain_transport` set)."""
        waiter: asyncio.Future[None] = self.loop.create_future()
        self._tls_protocol = sslproto.SSLProtocol(self.loop, self, context, waiter, server_side=True)  # type: ignore[arg-type]
        self._original_transport = self.transport
        assert self._original_transport is not None
        self._original_transport.set_protocol(self._tls_protocol)
        self.transport = self._tls_protocol._app_transport
        self._tls_protocol.connection_made(self._original_transport)
        return waiter

    async def serve_commands(self) -> None:
        """The command loop of one connection."""
        raise NotImplementedError

    def on_idle_timeout(self) -> None:
        """The idle timer fired."""
        super()._timeout_cb()  # type: ignore[no-untyped-call]  # aiosmtpd's own: close the transport

    async def _handle_client(self) -> None:
        await self.serve_commands()

    def _timeout_cb(self) -> None:
        self.on_idle_timeout()
