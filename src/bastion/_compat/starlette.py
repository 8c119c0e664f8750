"""Starlette internals Bastion relies on (verified on Starlette 1.10.0).

The compiled handlers (``bastion.routing._compiled``) parse a JSON body themselves and hand a request they
cannot answer to FastAPI's handler with the body already read. They assume:

- ``starlette.requests.Request._body``: set by ``Request.body()`` once the whole body is read (absent before);
  ``Request.stream()`` then yields it again.
- ``starlette.requests.Request._json``: what ``Request.json()`` returns when set (it parses the body only when
  absent).

Without them the compiled handlers switch themselves off (``supported()``; see ``bastion._compat.fastapi``).
``tests/bastion/compat/test_starlette.py`` checks each assumption.
"""

from __future__ import annotations

import importlib.metadata
import inspect

from starlette.requests import Request

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


def body_read(request: Request) -> bytes | None:
    """The body ``request.body()`` has read, or ``None`` when it has not been read."""
    body: bytes | None = getattr(request, "_body", None)
    return body


def remember_json(request: Request, parsed: object) -> None:
    """Make ``request.json()`` return ``parsed`` (the body, already parsed) without parsing it again."""
    request._json = parsed
