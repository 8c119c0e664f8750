"""Starlette internals Bastion relies on (verified on Starlette 1.10.0; `make compat` runs on 0.37.2 and 0.50.0).

The compiled handlers (``bastion.routing._compiled``) parse a JSON body themselves and hand a request they
cannot answer to FastAPI's handler with the body already read. They assume:

- ``starlette.requests.Request._body``: set by ``Request.body()`` once the whole body is read (absent before);
  ``Request.stream()`` then yields it again, and so do both when it is set before (a body read earlier, handed
  over).
- ``starlette.requests.Request._json``: what ``Request.json()`` returns when set (it parses the body only when
  absent).

Without them the compiled handlers switch themselves off (``supported()``; see ``bastion._compat.fastapi``).
``tests/bastion/compat/test_starlette.py`` checks each assumption.
"""

from __future__ import annotations

import importlib.metadata
import inspect

from starlette.requests import Request

from bastion.types import Scope

try:  # Starlette 1.x: a route's max_body_size, recorded in the scope
    from starlette.middleware.body_limit import MAX_BODY_SIZE_SCOPE_KEY
except ImportError:  # pragma: no cover - older Starlette: no body size limit in the scope
    MAX_BODY_SIZE_SCOPE_KEY = None  # type: ignore[assignment]

VERIFIED = "Starlette 1.10.0"
"""The Starlette version these assumptions were last checked on."""
PRIVATE_NAMES = frozenset({"_body", "_json"})
"""Every private name of Starlette this module touches (the wall test looks for them outside ``bastion._compat``)."""


def version() -> str:
    """The installed Starlette's version."""
    return importlib.metadata.version("starlette")


def supported() -> bool:
    """Whether ``Request.body()`` and ``Request.json()`` cache in ``_body`` and ``_json``."""
    try:
        body, json = inspect.getsource(Request.body), inspect.getsource(Request.json)
    except (OSError, TypeError):
        return False
    return "self._body" in body and "self._json" in json


def body_size_limited(scope: Scope) -> bool:
    """Whether a body size limit (``starlette.middleware.body_limit``, a route's ``max_body_size``) is in force."""
    return MAX_BODY_SIZE_SCOPE_KEY is not None and MAX_BODY_SIZE_SCOPE_KEY in scope


def body_read(request: Request) -> bytes | None:
    """The body ``request.body()`` has read, or ``None`` when it has not been read."""
    body: bytes | None = getattr(request, "_body", None)
    return body


def remember_body(request: Request, body: bytes) -> None:
    """Make ``request.body()`` (and ``request.stream()``) return ``body``, read earlier, without receiving it."""
    request._body = body


def remember_json(request: Request, parsed: object) -> None:
    """Make ``request.json()`` return ``parsed`` (the body, already parsed) without parsing it again."""
    request._json = parsed
