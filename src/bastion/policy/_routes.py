"""The optional admin route ``POST /admin/reload-policy`` an operator can mount."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bastion._claims import current_claims
from bastion.errors import PolicyDenied, PolicyError
from bastion.policy._engine import LoadedPolicies, PolicyLoadError


def reload_policy_route(
    reload: Callable[[], Awaitable[LoadedPolicies]], *, path: str = "/admin/reload-policy", admin_role: str = "admin"
) -> Route:
    """``POST {path}``: reload the policy file; 200 ``{"reloaded": true, "policies": n, "digest": ...}``.

    A file that does not parse keeps the old policies and answers 500 ``POLICY_ERROR`` with the reason.
    Callers need ``admin_role``.
    """

    async def reload_endpoint(request: Request) -> Response:
        if not current_claims(request).has_role(admin_role):
            raise PolicyDenied()
        try:
            loaded = await reload()
        except PolicyLoadError as exc:
            raise PolicyError(f"Policy reload failed, previous policies stay in force: {exc}") from None
        return JSONResponse({"reloaded": True, "policies": loaded.statements, "digest": loaded.digest})

    return Route(path, reload_endpoint, methods=["POST"], name="reload_policy")
