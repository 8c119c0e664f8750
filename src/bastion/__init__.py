"""Bastion: secure, versioned backend services on one port.

What a service author uses is importable from here. The names load on first use (PEP 562), so
``import bastion.errors`` or ``import bastion.types`` does not load FastAPI.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from bastion.errors import (
    BadRequest,
    BastionError,
    ConfigError,
    NotFound,
    PolicyDenied,
    RateLimitExceeded,
    TokenError,
    Unavailable,
)

if TYPE_CHECKING:
    from bastion._app import BastionApp
    from bastion._app_settings import app_settings
    from bastion._cache_store import CacheStore, MemoryCacheStore, RedisCacheStore
    from bastion._claims import Claims, current_claims, optional_claims
    from bastion._guard import Exemptions, Guard
    from bastion._health import ReadinessCheck
    from bastion._parts import Slot
    from bastion._service import Service
    from bastion.config import Settings, load_settings
    from bastion.routing import ApiVersion, Brownout, Deprecation, VersionedApi

_LAZY = {
    "ApiVersion": "bastion.routing",
    "BastionApp": "bastion._app",
    "Brownout": "bastion.routing",
    "CacheStore": "bastion._cache_store",
    "Claims": "bastion._claims",
    "Deprecation": "bastion.routing",
    "Exemptions": "bastion._guard",
    "Guard": "bastion._guard",
    "MemoryCacheStore": "bastion._cache_store",
    "ReadinessCheck": "bastion._health",
    "RedisCacheStore": "bastion._cache_store",
    "Service": "bastion._service",
    "Settings": "bastion.config",
    "Slot": "bastion._parts",
    "VersionedApi": "bastion.routing",
    "app_settings": "bastion._app_settings",
    "current_claims": "bastion._claims",
    "load_settings": "bastion.config",
    "optional_claims": "bastion._claims",
}

__all__ = [
    "ApiVersion",
    "BadRequest",
    "BastionApp",
    "BastionError",
    "Brownout",
    "CacheStore",
    "Claims",
    "ConfigError",
    "Deprecation",
    "Exemptions",
    "Guard",
    "MemoryCacheStore",
    "NotFound",
    "PolicyDenied",
    "RateLimitExceeded",
    "ReadinessCheck",
    "RedisCacheStore",
    "Service",
    "Settings",
    "Slot",
    "TokenError",
    "Unavailable",
    "VersionedApi",
    "app_settings",
    "current_claims",
    "load_settings",
    "optional_claims",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'bastion' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
