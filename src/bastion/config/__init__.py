"""Typed settings: one TOML file plus ``SERVICE_*`` environment overrides, validated at start-up.

Every key of the spec's configuration tables exists here with the spec's default (where the spec gives none,
the default is documented in ``docs/configuration.md``).
"""

from bastion.config._limits import IdempotencySettings, PlanSettings, RateLimitSettings, RouteRule
from bastion.config._load import PATH_KEYS, load_settings, masked, read_file
from bastion.config._masking import masked_app
from bastion.config._messaging import BrokerSettings, StreamSettings
from bastion.config._observability import AuditSettings, MetricsSettings, TracingSettings
from bastion.config._sections import (
    AccessLogSettings,
    AppTable,
    CacheStoreSettings,
    CompressionSettings,
    CorsSettings,
    GrpcSettings,
    MiddlewareSettings,
    PolicySettings,
    ResilienceSettings,
    SecurityHeadersSettings,
    ServiceSettings,
    Settings,
    TokenSettings,
)
from bastion.config._tls import TlsSettings

__all__ = [
    "PATH_KEYS",
    "AccessLogSettings",
    "AppTable",
    "AuditSettings",
    "BrokerSettings",
    "CacheStoreSettings",
    "CompressionSettings",
    "CorsSettings",
    "GrpcSettings",
    "IdempotencySettings",
    "MetricsSettings",
    "MiddlewareSettings",
    "PlanSettings",
    "PolicySettings",
    "RateLimitSettings",
    "ResilienceSettings",
    "RouteRule",
    "SecurityHeadersSettings",
    "ServiceSettings",
    "Settings",
    "StreamSettings",
    "TlsSettings",
    "TokenSettings",
    "TracingSettings",
    "load_settings",
    "masked",
    "masked_app",
    "read_file",
]
