"""Versioned routing, deprecation, route resolution and dispatch."""

from bastion.routing.deprecation import Deprecation, DeprecationMiddleware
from bastion.routing.fallback import Dispatcher
from bastion.routing.resolve import ResolvedRoute, RouteResolutionMiddleware, RouteTable
from bastion.routing.versioned import ApiVersion, VersionedApi

__all__ = [
    "ApiVersion",
    "Deprecation",
    "DeprecationMiddleware",
    "Dispatcher",
    "ResolvedRoute",
    "RouteResolutionMiddleware",
    "RouteTable",
    "VersionedApi",
]
