"""uvicorn internals Bastion relies on (verified on uvicorn 0.54.0; `make compat` runs on 0.44.0 and 0.30.0).

The listener (``bastion._listener``) subclasses uvicorn's httptools protocol (``BoundedHttpProtocol``), its flow
control (``ReadGate``), its request/response cycle (``CoalescingCycle``) and its WebSocket protocol: the
websockets-sansio one from uvicorn 0.35 (``SANSIO_WEBSOCKETS``), before that the one on websockets' legacy
implementation (``websockets_impl.WebSocketProtocol``, what uvicorn 0.30 to 0.34 serve WebSockets with), and
reads their public attributes (``pipeline``, ``cycle``, ``flow``, ``parser``, ``headers``; a cycle's ``body``,
``more_body``, ``disconnected``, ``response_complete``; ...). The private names it needs:

- ``HttpToolsProtocol._unset_keepalive_if_required()``: cancels the keep-alive timer when a request arrives.
- ``HttpToolsProtocol._should_upgrade()``: whether an ``Upgrade`` request is a WebSocket upgrade uvicorn serves.
- ``HttpToolsProtocol._unsupported_upgrade_warning()``: uvicorn's warning for an upgrade it does not serve (0.32
  and later; before, ``warn_unsupported_upgrade`` logs uvicorn's text itself).
- ``WebSocketsSansIOProtocol``'s message being assembled when ``send_receive_event_to_app`` runs: ``frames`` (a
  list of fragments, uvicorn 0.50 and later) or ``bytes`` (the fragments joined, 0.35 to 0.49), both public
  attributes whose shape changed: ``websocket_message`` / ``forget_websocket_message`` read and clear either.
- A refused WebSocket handshake (``websocket.http.response.*``): uvicorn 0.53 and later send the app's headers
  (adding ``Date``, ``Connection``, ``Content-Length``, ``Content-Type`` only when absent). uvicorn 0.35 to 0.52
  send websockets' own ``Content-Length`` and ``Content-Type`` beside the app's, two of each: an answer no client
  reads. There, ``send_refusal`` sends it as 0.53 does, from the protocol's public ``initial_response``, ``conn``,
  ``queue``, ``close_sent`` and ``transport`` (what uvicorn's ``send`` uses).
- A ``RequestResponseCycle`` whose class is replaced by a subclass that only overrides ``send`` and adds class
  attributes (``adopt_cycle``) behaves as that subclass: uvicorn builds the cycle itself, in
  ``on_headers_complete``, and starts its task later.

The runner (``bastion._runner``):

- ``uvicorn.supervisors.Multiprocess(config, sockets=...)`` (0.53 and later) builds each worker's ``Server``;
  before, it takes ``target`` (``Server(config=config).run``, as uvicorn's own ``main`` passes it):
  ``multiprocess`` passes it where the signature has it.

- ``uvicorn.Server._captured_signals``: the signals uvicorn re-raises after a graceful shutdown (Bastion clears
  them to exit 0). Without it the process exits with the signal, as uvicorn does.

The listener's limits are a security boundary: ``check()`` runs at start-up and refuses to serve, in one line
naming the supported versions, when a hook is missing. ``tests/bastion/compat/test_uvicorn.py`` checks each
assumption.
"""

from __future__ import annotations

import email.utils
import http
import importlib.metadata
import importlib.util
import inspect
import socket
from typing import Any, TypeVar

import uvicorn
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from websockets.datastructures import Headers
from websockets.http11 import Response

from bastion.errors import ConfigError

VERIFIED = "uvicorn 0.54.0"
"""The uvicorn version these assumptions were last checked on."""
SUPPORTED = "uvicorn 0.30.0 to 0.54.x"
"""The range pyproject.toml declares (`make compat` runs its oldest release)."""
PROTOCOL_HOOKS = ("_unset_keepalive_if_required", "_should_upgrade")
"""Private methods of ``HttpToolsProtocol`` the listener needs."""
PRIVATE_NAMES = frozenset({*PROTOCOL_HOOKS, "_unsupported_upgrade_warning", "_captured_signals"})
"""Every private name of uvicorn this module touches (the wall test looks for them outside ``bastion._compat``)."""

CycleT = TypeVar("CycleT", bound=RequestResponseCycle)

SANSIO_WEBSOCKETS = importlib.util.find_spec("uvicorn.protocols.websockets.websockets_sansio_impl") is not None
"""Whether uvicorn has its websockets-sansio protocol (0.35 and later), which the listener's WebSocket protocol
subclasses; before, it subclasses uvicorn's protocol on websockets' legacy implementation."""


def version() -> str:
    """The installed uvicorn's version."""
    return importlib.metadata.version("uvicorn")


def missing() -> list[str]:
    """The hooks the listener needs that the installed uvicorn lacks (``[]``: none)."""
    absent = [
        f"HttpToolsProtocol.{name}" for name in PROTOCOL_HOOKS if not callable(getattr(HttpToolsProtocol, name, None))
    ]
    cycle_init = inspect.signature(RequestResponseCycle.__init__).parameters
    if not {"scope", "transport", "flow", "message_event", "keep_alive", "on_response"} <= set(cycle_init):
        absent.append("RequestResponseCycle.__init__(scope, transport, flow, message_event, keep_alive, on_response)")
    return absent


def check() -> None:
    """Refuse to serve (ConfigError, one line) when the installed uvicorn lacks a hook the listener's limits need."""
    absent = missing()
    if absent:
        raise ConfigError(
            f"uvicorn {version()} lacks what Bastion's listener limits rely on ({', '.join(absent)}); "
            f"supported: {SUPPORTED}"
        )


def unset_keepalive(protocol: HttpToolsProtocol) -> None:
    """Cancel the connection's keep-alive timer (a request has arrived)."""
    protocol._unset_keepalive_if_required()


def should_upgrade(protocol: HttpToolsProtocol) -> bool:
    """Whether the request just parsed asks for a WebSocket upgrade uvicorn serves."""
    return bool(protocol._should_upgrade())


def warn_unsupported_upgrade(protocol: HttpToolsProtocol) -> None:
    """uvicorn's warning for an upgrade it does not serve (the request is then answered as plain HTTP)."""
    warning = getattr(protocol, "_unsupported_upgrade_warning", None)
    if warning is None:  # uvicorn before 0.32: its text, as _should_upgrade_to_ws logged it
        protocol.logger.warning("Unsupported upgrade request.")
    else:
        warning()


def adopt_cycle(cycle: RequestResponseCycle, cycle_class: type[CycleT]) -> CycleT:
    """``cycle`` (built by uvicorn, its task not started) as a ``cycle_class``: a subclass without ``__init__``."""
    cycle.__class__ = cycle_class
    return cycle  # type: ignore[return-value]


def websocket_message(protocol: Any) -> bytes:
    """The data message a websockets-sansio protocol has assembled (``send_receive_event_to_app`` delivers it)."""
    frames: list[bytes] | None = getattr(protocol, "frames", None)
    if frames is None:  # uvicorn 0.35 to 0.49: one bytes object
        return bytes(protocol.bytes)
    return frames[0] if len(frames) == 1 else b"".join(frames)


def forget_websocket_message(protocol: Any) -> None:
    """Drop the assembled message (it is refused, not delivered)."""
    if getattr(protocol, "frames", None) is None:
        protocol.bytes = b""
    else:
        protocol.frames = []


def _refusal_keeps_app_headers() -> bool:
    if not SANSIO_WEBSOCKETS:
        return False  # the legacy protocol: websockets' handshake adds its headers only where absent (setdefault)
    from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

    return 'setdefault("Content-Length"' in inspect.getsource(WebSocketsSansIOProtocol.send)


REFUSAL_KEEPS_APP_HEADERS = _refusal_keeps_app_headers()
"""Whether uvicorn's websockets-sansio protocol sends a refused handshake's headers as the app gave them (0.53 and
later); ``False`` on the legacy protocol (uvicorn before 0.35), which ``send_refusal`` is not used with."""


def send_refusal(protocol: Any, message: Any) -> bool:
    """On uvicorn 0.35 to 0.52, take a ``websocket.http.response.body`` message of a refused handshake and send the
    refusal as uvicorn 0.53 and later do (``True``: sent or kept, uvicorn's ``send`` must not run)."""
    if REFUSAL_KEEPS_APP_HEADERS or message["type"] != "websocket.http.response.body":
        return False
    if protocol.initial_response is None or protocol.close_sent:
        return False
    status, headers, body = protocol.initial_response
    body += message.get("body", b"")
    protocol.initial_response = (status, headers, body)
    if message.get("more_body", False):
        return True
    response_headers = Headers(headers)
    response_headers.setdefault("Date", email.utils.formatdate(usegmt=True))
    response_headers.setdefault("Connection", "close")
    response_headers.setdefault("Content-Length", str(len(body)))
    response_headers.setdefault("Content-Type", "text/plain; charset=utf-8")
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    protocol.queue.put_nowait({"type": "websocket.disconnect", "code": 1006})
    protocol.conn.send_response(Response(status, phrase, response_headers, body))
    output = protocol.conn.data_to_send()
    protocol.close_sent = True
    protocol.transport.write(b"".join(output))
    protocol.transport.close()
    return True


async def refusal_complete(protocol: Any) -> Any:
    """On the legacy WebSocket protocol (uvicorn 0.30 to 0.34), the refusal the app sent, once its last body part
    has arrived (``initial_response``: status, headers, body)."""
    await protocol.closed_event.wait()
    return protocol.initial_response


def multiprocess(config: Config, sockets: list[socket.socket]) -> Any:
    """uvicorn's supervisor of ``config.workers`` worker processes serving ``sockets``."""
    from uvicorn.supervisors import Multiprocess

    if "target" in inspect.signature(Multiprocess.__init__).parameters:  # uvicorn before 0.53
        return Multiprocess(config, target=uvicorn.Server(config=config).run, sockets=sockets)  # type: ignore[call-arg,unused-ignore]
    return Multiprocess(config, sockets=sockets)  # type: ignore[call-arg,unused-ignore]


def forget_captured_signals(server: uvicorn.Server) -> None:
    """Keep uvicorn from re-raising the signal that stopped it (a graceful shutdown then exits 0)."""
    captured: Any = getattr(server, "_captured_signals", None)
    if captured is not None:
        captured.clear()
