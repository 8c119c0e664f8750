"""The public API: each package root exports exactly a deliberate list; implementation modules are private."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import pytest

EXPECTED = {
    "bastion": [
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
    ],
    "bastion.auth": ["Claims", "current_claims", "optional_claims"],
    "bastion.policy": [
        "ANONYMOUS_TYPE",
        "PRINCIPAL_TYPE",
        "RESOURCE_TYPE",
        "Decision",
        "Normalizer",
        "PolicyLoadError",
        "ResourceExtractor",
        "default_normalizer",
        "load_policies",
    ],
    "bastion.idempotency": ["IdempotencyMiddleware", "IdempotentRoutes"],
    "bastion.ratelimit": ["Bucket", "LimiterStore", "Outcome", "Quota", "RateLimiting"],
    "bastion.routing": ["ApiVersion", "Brownout", "Deprecation", "VersionedApi"],
    "bastion.resilience": [
        "BreakerState",
        "Bulkhead",
        "BulkheadFullError",
        "CircuitBreaker",
        "CircuitOpenError",
        "Guard",
        "ResilientTransport",
        "outbound_guard",
    ],
    "bastion.broker": ["Broker", "BrokerMessage", "current_broker", "optional_broker"],
    "bastion.middleware": [],
    "bastion.grpc": [],
    "bastion.config": [
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
    ],
    "bastion.errors": [
        "BadRequest",
        "BastionError",
        "BrokerRequestFailed",
        "BrokerTimeout",
        "BrokerUnavailable",
        "BulkheadFull",
        "CacheStoreError",
        "CircuitOpen",
        "ClientCertificateMismatch",
        "ClientCertificateRequired",
        "ConfigError",
        "GatewayTimeout",
        "Gone",
        "HeadersTooLarge",
        "IdempotencyConflict",
        "IdempotencyKeyInvalid",
        "IdempotencyKeyMissing",
        "IdempotencyKeyReused",
        "IdempotencyUnavailable",
        "InvalidToken",
        "JsonTooDeep",
        "MalformedBody",
        "MethodNotAllowed",
        "NoResponders",
        "NotFound",
        "NotReady",
        "PayloadTooLarge",
        "PolicyDenied",
        "PolicyError",
        "RateLimitExceeded",
        "RequestTimeout",
        "TokenError",
        "TokenExpired",
        "TokenRevoked",
        "TransferCodingNotImplemented",
        "Unavailable",
        "UnsupportedMediaType",
        "ValidationFailed",
        "render",
    ],
    "bastion.types": [
        "H2_PROTOCOL_FACTORY",
        "RESPONSE_START",
        "SCOPE_API_VERSION",
        "SCOPE_CLAIMS",
        "SCOPE_CLIENT_CERTIFICATE",
        "SCOPE_DEFERRED_REVOCATION",
        "SCOPE_GRPC_RESOURCE",
        "SCOPE_REQUEST_ID",
        "SCOPE_RESPONSE_HEADERS",
        "SCOPE_ROUTE",
        "ASGIApp",
        "Headers",
        "Message",
        "Receive",
        "Scope",
        "Send",
    ],
    "bastion.testing": [
        "AsyncServiceClient",
        "AsyncWebSocketSession",
        "FakeClock",
        "MemoryBroker",
        "PasetoMinter",
        "ServiceClient",
        "SyncMemoryBroker",
        "TokenMinter",
        "WebSocketDenialResponse",
        "WebSocketSession",
        "check_policy_cases",
        "write_dev_keys",
    ],
    "bastion_core": [
        "MASK",
        "MAX_BACKOFF_SECS",
        "MAX_RETRY_AFTER_SECS",
        "UNKNOWN_VARIABLE_EVENT",
        "BreakerSnapshot",
        "BreakerState",
        "Bulkhead",
        "BulkheadFullError",
        "BulkheadSnapshot",
        "Call",
        "CertificateFiles",
        "CertificateSetError",
        "CircuitBreaker",
        "CircuitOpenError",
        "Clock",
        "ConfigError",
        "Guard",
        "ReloadingClientContext",
        "ReloadingServerContext",
        "ResilientTransport",
        "Ticket",
        "backoff_delay",
        "configure_logging",
        "log_event",
        "mask_url",
        "parse_retry_after",
        "retry_wait",
        "running_loop",
    ],
    "bastion_core.testing": ["DevCA", "FakeClock", "Issued", "free_port"],
    "mailrelay": [
        "AttachmentTooLarge",
        "ConfigError",
        "DeliveryError",
        "HtmlTextTooLong",
        "ListenFailed",
        "MessageParseError",
        "RelayError",
        "Settings",
        "__version__",
        "compute_signature",
        "load_settings",
        "parse_settings",
        "verify_signature",
    ],
    "mailrelay.smtp": [
        "Envelope",
        "EnvelopeHandler",
        "RelaySMTP",
        "Reply",
        "SenderPolicy",
        "Session",
        "SmtpOptions",
        "SmtpServer",
        "SmtpState",
    ],
    "mailrelay.testing": [
        "FakeClock",
        "RecordedRequest",
        "ScriptedResponse",
        "WebhookReceiver",
        "free_port",
        "payload_schema",
    ],
}
# Modules (not packages) that are public without an underscore: the few a user imports by name.
PUBLIC_MODULES = {
    "bastion.errors",
    "bastion.types",
    "bastion.testing.pytest_plugin",
    "bastion_core.testing",
    "mailrelay.cli",
    "mailrelay.testing",
}
HEAVY = ("fastapi", "starlette", "uvicorn", "cedarpy", "grpclib")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_all_is_the_expected_list(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__all__ == EXPECTED[name]
    for symbol in module.__all__:
        assert hasattr(module, symbol), symbol


@pytest.mark.parametrize("root", ["bastion", "bastion_core", "mailrelay"])
def test_implementation_modules_are_private(root: str) -> None:
    package = importlib.import_module(root)
    public = set()
    for info in pkgutil.walk_packages(package.__path__, prefix=f"{root}."):
        parts = info.name.split(".")
        if not any(part.startswith("_") for part in parts[1:]) and not info.ispkg:
            public.add(info.name)
    assert public == {name for name in PUBLIC_MODULES if name.startswith(f"{root}.")}


@pytest.mark.parametrize("module", ["bastion.errors", "bastion.types", "bastion_core", "bastion_core.testing"])
def test_light_modules_load_no_web_framework(module: str) -> None:
    """The error tree, the ASGI vocabulary and the core import without FastAPI, uvicorn or cedarpy."""
    code = f"import sys, {module}; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"
