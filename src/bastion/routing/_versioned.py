"""The versioned builder: the only way to register business routes (``{base_path}/v<N>/...``)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from fastapi import APIRouter
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute

from bastion._exception_handlers import ExceptionHandler, register
from bastion.config import RouteRule
from bastion.errors import ConfigError
from bastion.routing._deprecation import Deprecation, HeaderForm
from bastion.routing._limits import parse_rate
from bastion.routing._sunset import Brownout
from bastion.types import Headers

F = TypeVar("F", bound=Callable[..., Any])


class ApiVersion(APIRouter):
    """One major version: a FastAPI ``APIRouter`` whose paths are relative to ``{base_path}/v<N>``.

    Register handlers exactly as on any FastAPI router (``@v1.get("/documents")``, ``include_router``,
    pydantic models, ``Depends``). The prefix is applied when the service is built. The route methods also
    take ``rate_limit="10/minute"`` (``N/second|minute|hour|day``): the route's own ``[rate_limit.routes]``
    entry, which an entry of the configuration for the same route replaces (docs/ratelimit.md); and
    ``idempotency=True``: the route takes an ``Idempotency-Key`` as if listed in ``[idempotency] routes``
    (docs/idempotency.md).
    """

    def __init__(self, number: int, *, api: VersionedApi, **router_kwargs: Any) -> None:
        if "prefix" in router_kwargs:
            raise ConfigError("ApiVersion takes no prefix: its routes live under {base_path}/v<N>")
        super().__init__(**router_kwargs)
        self.number = number
        self._api = api
        self.exception_handlers: dict[type[BaseException], Any] = {}
        self.rate_limits: list[tuple[APIRoute, RouteRule]] = []
        """The routes registered with ``rate_limit=``, and their rule."""
        self.idempotent: list[APIRoute] = []
        """The routes registered with ``idempotency=True``."""

    def _limited(
        self, rate_limit: str | None, path: str, decorator: Callable[[F], F], idempotency: bool = False
    ) -> Callable[[F], F]:
        if rate_limit is None and not idempotency:
            return decorator
        rule = parse_rate(rate_limit, route=f"{self.label} {path!r}") if rate_limit is not None else None

        def register(endpoint: F) -> F:
            before = len(self.routes)
            decorated = decorator(endpoint)
            added = [route for route in self.routes[before:] if isinstance(route, APIRoute)]
            if rule is not None:
                self.rate_limits += [(route, rule) for route in added]
            if idempotency:
                self.idempotent += added
            return decorated

        return register

    def api_route(
        self, path: str, *, rate_limit: str | None = None, idempotency: bool = False, **kwargs: Any
    ) -> Callable[[F], F]:
        return self._limited(rate_limit, path, super().api_route(path, **kwargs), idempotency)

    def get(
        self, path: str, *, rate_limit: str | None = None, idempotency: bool = False, **kwargs: Any
    ) -> Callable[[F], F]:
        return self._limited(rate_limit, path, super().get(path, **kwargs), idempotency)

    def put(
        self, path: str, *, rate_limit: str | None = None, idempotency: bool = False, **kwargs: Any
    ) -> Callable[[F], F]:
        return self._limited(rate_limit, path, super().put(path, **kwargs), idempotency)

    def post(
        self, path: str, *, rate_limit: str | None = None, idempotency: bool = False, **kwargs: Any
    ) -> Callable[[F], F]:
        return self._limited(rate_limit, path, super().post(path, **kwargs), idempotency)

    def delete(
        self, path: str, *, rate_limit: str | None = None, idempotency: bool = False, **kwargs: Any
    ) -> Callable[[F], F]:
        return self._limited(rate_limit, path, super().delete(path, **kwargs), idempotency)

    def patch(
        self, path: str, *, rate_limit: str | None = None, idempotency: bool = False, **kwargs: Any
    ) -> Callable[[F], F]:
        return self._limited(rate_limit, path, super().patch(path, **kwargs), idempotency)

    def head(
        self, path: str, *, rate_limit: str | None = None, idempotency: bool = False, **kwargs: Any
    ) -> Callable[[F], F]:
        return self._limited(rate_limit, path, super().head(path, **kwargs), idempotency)

    def options(
        self, path: str, *, rate_limit: str | None = None, idempotency: bool = False, **kwargs: Any
    ) -> Callable[[F], F]:
        return self._limited(rate_limit, path, super().options(path, **kwargs), idempotency)

    def trace(
        self, path: str, *, rate_limit: str | None = None, idempotency: bool = False, **kwargs: Any
    ) -> Callable[[F], F]:
        return self._limited(rate_limit, path, super().trace(path, **kwargs), idempotency)

    def exception_handler(self, exc_class: type[Exception]) -> Callable[[ExceptionHandler], ExceptionHandler]:
        """Decorator: handle ``exc_class`` (and its subclasses) raised by this version's routes, before the
        service's own handler for it (see :meth:`bastion.Service.exception_handler`)."""

        def add(handler: ExceptionHandler) -> ExceptionHandler:
            register(self.exception_handlers, exc_class, handler)
            return handler

        return add

    @property
    def label(self) -> str:
        return f"v{self.number}"

    @property
    def deprecation(self) -> Deprecation | None:
        return self._api.deprecations.get(self.number)


def _check_number(number: object) -> int:
    if isinstance(number, bool) or not isinstance(number, int) or number < 1:
        raise ConfigError(f"API version {number!r} must be a positive integer (v1, v2, ...)")
    return number


class VersionedApi:
    """Versions v1, v2, v3 ... (numbers may be skipped) under one base path (default: ``service.base_path``).

    ``version(1, deprecated=...)`` registers a version, possibly already deprecated;
    ``deprecate(1, replacement=2, ...)`` marks one deprecated later, even while serving.
    """

    def __init__(self, *, base_path: str | None = None) -> None:
        self.base_path = base_path
        self.versions: dict[int, ApiVersion] = {}
        self.deprecations: dict[int, Deprecation] = {}
        self._headers: dict[tuple[int, HeaderForm], Headers] = {}
        self._openapi: dict[tuple[int, str, str, str], dict[str, Any]] = {}

    def version(
        self,
        number: int,
        *,
        deprecated: Deprecation | None = None,
        **router_kwargs: Any,
    ) -> ApiVersion:
        """Register major version ``number`` and return its router."""
        number = _check_number(number)
        if number in self.versions:
            raise ConfigError(f"API version v{number} is registered twice")
        self.versions[number] = ApiVersion(number, api=self, **router_kwargs)
        if deprecated is not None:
            self._set_deprecation(number, deprecated)
        return self.versions[number]

    def deprecate(
        self,
        number: int,
        *,
        replacement: int,
        sunset: str | datetime | None = None,
        message: str | None = None,
        enforce_sunset: bool = False,
        brownout: Brownout | None = None,
        since: str | datetime | None = None,
    ) -> None:
        """Mark a registered version deprecated, with its replacement, optional RFC 3339 sunset and message,
        sunset enforcement (410 from the sunset on), brownout schedule and deprecation date (see Deprecation)."""
        if number not in self.versions:
            raise ConfigError(f"cannot deprecate v{number}: it is not registered")
        self._set_deprecation(
            number,
            Deprecation(
                replacement=replacement,
                sunset=sunset,
                message=message,
                enforce_sunset=enforce_sunset,
                brownout=brownout,
                since=since,
            ),
        )

    def _set_deprecation(self, number: int, deprecation: Deprecation) -> None:
        if deprecation.replacement == number:
            raise ConfigError(f"v{number} cannot be its own replacement")
        self.deprecations[number] = deprecation
        self._headers = {key: headers for key, headers in self._headers.items() if key[0] != number}
        self._openapi = {key: document for key, document in self._openapi.items() if key[0] != number}

    def deprecation_headers(self, number: int, form: HeaderForm = "version") -> Headers:
        """The headers of a deprecated version's responses (none for a current one), built once per form."""
        deprecation = self.deprecations.get(number)
        if deprecation is None:
            return []
        headers = self._headers.get((number, form))
        if headers is None:
            headers = self._headers[(number, form)] = deprecation.headers(number, form)
        return headers

    def validate(self) -> None:
        """Check cross-version facts once all versions are registered (at build)."""
        if not self.versions:
            raise ConfigError("no API version registered: add one with api.version(1)")
        for number, deprecation in self.deprecations.items():
            if deprecation.replacement not in self.versions:
                raise ConfigError(
                    f"v{number} is deprecated in favour of v{deprecation.replacement}, which is not registered"
                )

    def prefix(self, number: int, base_path: str) -> str:
        return f"{base_path}/v{number}"

    def openapi(self, number: int, *, base_path: str, title: str, version: str) -> dict[str, Any]:
        """The OpenAPI document of one version as FastAPI builds it (cached; rebuilt after a deprecation change).

        The served document adds what the pipeline answers: ``bastion.routing._openapi``."""
        key = (number, base_path, title, version)
        cached = self._openapi.get(key)
        if cached is not None:
            return cached
        router = APIRouter()
        router.include_router(self.versions[number], prefix=self.prefix(number, base_path))
        deprecation = self.deprecations.get(number)
        description = None
        if deprecation is not None:
            description = f"API version v{number} is deprecated. Please migrate to version v{deprecation.replacement}."
            if deprecation.message:
                description += f" {deprecation.message}"
        document = get_openapi(
            title=f"{title} v{number}", version=version, routes=router.routes, description=description
        )
        if deprecation is not None:
            document["info"]["x-deprecated"] = True
            document["info"]["x-replacement-version"] = f"v{deprecation.replacement}"
            if deprecation.sunset_rfc3339:
                document["info"]["x-sunset"] = deprecation.sunset_rfc3339
            for operations in document.get("paths", {}).values():
                for operation in operations.values():
                    if isinstance(operation, dict):
                        operation["deprecated"] = True
        self._openapi[key] = document
        return document
