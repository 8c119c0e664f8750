"""Bastion: secure, versioned backend services on one port."""

from bastion.app import BastionApp
from bastion.config import Settings, load_settings
from bastion.errors import (
    BastionError,
    ConfigError,
    NotFound,
    PolicyDenied,
    RateLimitExceeded,
    TokenError,
    Unavailable,
)
from bastion.health import ReadinessCheck
from bastion.routing.deprecation import Deprecation
from bastion.routing.versioned import ApiVersion, VersionedApi
from bastion.service import Service, Slot

__all__ = [
    "ApiVersion",
    "BastionApp",
    "BastionError",
    "ConfigError",
    "Deprecation",
    "NotFound",
    "PolicyDenied",
    "RateLimitExceeded",
    "ReadinessCheck",
    "Service",
    "Settings",
    "Slot",
    "TokenError",
    "Unavailable",
    "VersionedApi",
    "load_settings",
]
