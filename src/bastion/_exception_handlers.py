"""Exception handlers (``@service.exception_handler(MyError)``, ``@v2.exception_handler(...)``): a domain exception
raised in a handler becomes the error (or response) its handler returns instead of a 500.

A handler is ``(request, exc) -> BastionError | Response`` (``def`` or ``async def``, as in FastAPI). The error
renders in the one error shape over HTTP and as its ``grpc_status`` over gRPC; a response is sent as it is over
HTTP, and over gRPC ends the call with the status of the Bastion error of the same HTTP status.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from bastion._callables import as_async
from bastion.errors import BastionError, ConfigError
from bastion.types import SCOPE_API_VERSION, Message, Scope

ExceptionHandler = Callable[[Request, Any], "BastionError | Response | Awaitable[BastionError | Response]"]
"""``(request, exc) -> BastionError | Response`` (or an awaitable of one)."""
Handled = BastionError | Response
Handlers = Mapping[type[BaseException], Callable[[Request, Any], Awaitable[Any]]]


def register(handlers: dict[type[BaseException], Any], exc_class: object, handler: ExceptionHandler) -> None:
    """Check ``exc_class`` and ``handler`` (refused with one line) and add them to ``handlers``."""
    if not (isinstance(exc_class, type) and issubclass(exc_class, Exception)):
        raise ConfigError(f"exception_handler({exc_class!r}): expected an Exception subclass")
    handlers[exc_class] = as_async(handler, what=f"exception_handler({exc_class.__name__})", arguments=2)


async def _no_body() -> Message:
    return {"type": "http.disconnect"}


@dataclass(frozen=True, slots=True, kw_only=True)
class ExceptionHandlers:
    """The service's handlers and each API version's; a version's handler wins over the service's."""

    service: Handlers = field(default_factory=dict)
    versions: Mapping[int, Handlers] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.service) or any(self.versions.values())

    def find(
        self, exc: BaseException, version: int | None, *, rendered: bool = False
    ) -> Callable[[Request, Any], Awaitable[Any]] | None:
        """The handler for ``exc``: the closest class in its MRO, the version's handlers before the service's.

        ``rendered``: Bastion already has an answer for ``exc`` (a BastionError such as a 401 or 403, an
        ``HTTPException``, a validation error); only a handler registered for one of its own classes takes it,
        a catch-all one (``Exception``) does not, so it cannot turn the pipeline's rejections into something else.
        """
        tables = [self.versions.get(version, {}), self.service] if version is not None else [self.service]
        mro = type(exc).__mro__
        if rendered:
            mro = mro[: mro.index(Exception)]
        for table in tables:
            for cls in mro:
                handler = table.get(cls)
                if handler is not None:
                    return handler
        return None

    async def handle(self, exc: BaseException, scope: Scope, *, rendered: bool = False) -> Handled | None:
        """What the handler for ``exc`` returns (``None`` when there is none); a BastionError it raises counts as
        returned. A gRPC call's request is the call as an HTTP/2 POST: method path and metadata, no body."""
        handler = self.find(exc, scope.get(SCOPE_API_VERSION), rendered=rendered)
        if handler is None:
            return None
        if scope["type"] == "grpc":
            call = {"scheme": "http", "server": None, "root_path": "", "query_string": b"", **scope, "type": "http"}
            request = Request(call, _no_body)
        else:
            request = Request(scope)
        try:
            result = await handler(request, exc)
        except BastionError as error:
            return error
        if not isinstance(result, BastionError | Response):
            raise TypeError(
                f"exception handler for {type(exc).__name__} returned {type(result).__name__}; "
                "expected a BastionError or a Response"
            )
        return result


def grpc_status_of(handled: Handled) -> BastionError:
    """The Bastion error a gRPC call ends with: the handler's error, or for a response the error class of its
    HTTP status (a 500 when none has it), with the response's status phrase as message."""
    if isinstance(handled, BastionError):
        return handled
    status = handled.status_code
    cls = next((cls for cls in BastionError.__subclasses__() if cls.status == status), BastionError)
    return cls()
