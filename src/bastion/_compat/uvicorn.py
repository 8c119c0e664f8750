"""uvicorn internals Bastion relies on (verified on uvicorn 0.54.0; `make compat` runs on 0.44.0 and 0.35.0).

The listener (``bastion._listener``) subclasses uvicorn's httptools protocol (``BoundedHttpProtocol``), its flow
control (``ReadGate``), its request/response cycle (``CoalescingCycle``) and its websockets-sansio protocol, and
reads their public attributes (``pipeline``, ``cycle``, ``flow``, ``parser``, ``headers``; a cycle's ``body``,
``more_body``, ``disconnected``, ``response_complete``; ...). The private names it needs:

- ``HttpToolsProtocol._unset_keepalive_if_required()``: cancels the keep-alive timer when a request arrives.
- ``HttpToolsProtocol._should_upgrade()``: whether an ``Upgrade`` request is a WebSocket upgrade uvicorn serves.
- ``HttpToolsProtocol._unsupported_upgrade_warning()``: uvicorn's warning for an upgrade it does not serve.
- A ``RequestResponseCycle`` whose class is replaced by a subclass that only overrides ``send`` and adds class
  attributes (``adopt_cycle``) behaves as that subclass: uvicorn builds the cycle itself, in
  ``on_headers_complete``, and starts its task later.

The runner (``bastion._runner``):

- ``uvicorn.Server._captured_signals``: the signals uvicorn re-raises after a graceful shutdown (Bastion clears
  them to exit 0). Without it the process exits with the signal, as uvicorn does.

The listener's limits are a security boundary: ``check()`` runs at start-up and refuses to serve, in one line
naming the supported versions, when a hook is missing. ``tests/bastion/compat/test_uvicorn.py`` checks each
assumption.
"""

from __future__ import annotations

import importlib.metadata
import inspect
from typing import Any, TypeVar

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from bastion.errors import ConfigError

VERIFIED = "uvicorn 0.54.0"
"""The uvicorn version these assumptions were last checked on."""
PROTOCOL_HOOKS = ("_unset_keepalive_if_required", "_should_upgrade", "_unsupported_upgrade_warning")
"""Private methods of ``HttpToolsProtocol`` the listener calls."""
PRIVATE_NAMES = frozenset({*PROTOCOL_HOOKS, "_captured_signals"})
"""Every private name of uvicorn this module touches (the wall test looks for them outside ``bastion._compat``)."""

CycleT = TypeVar("CycleT", bound=RequestResponseCycle)


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
            f"supported: {VERIFIED}"
        )


def unset_keepalive(protocol: HttpToolsProtocol) -> None:
    """Cancel the connection's keep-alive timer (a request has arrived)."""
    protocol._unset_keepalive_if_required()


def should_upgrade(protocol: HttpToolsProtocol) -> bool:
    """Whether the request just parsed asks for a WebSocket upgrade uvicorn serves."""
    return bool(protocol._should_upgrade())


def warn_unsupported_upgrade(protocol: HttpToolsProtocol) -> None:
    """uvicorn's warning for an upgrade it does not serve (the request is then answered as plain HTTP)."""
    protocol._unsupported_upgrade_warning()


def adopt_cycle(cycle: RequestResponseCycle, cycle_class: type[CycleT]) -> CycleT:
    """``cycle`` (built by uvicorn, its task not started) as a ``cycle_class``: a subclass without ``__init__``."""
    cycle.__class__ = cycle_class
    return cycle  # type: ignore[return-value]


def forget_captured_signals(server: uvicorn.Server) -> None:
    """Keep uvicorn from re-raising the signal that stopped it (a graceful shutdown then exits 0)."""
    captured: Any = getattr(server, "_captured_signals", None)
    if captured is not None:
        captured.clear()
