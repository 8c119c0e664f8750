"""What protects a service, built once from the settings, and the posture summary that says so.

:meth:`Security.from_settings` is the one start-up check that ``bastion run`` (through ``Service.build``) and
``bastion check-config`` share: it refuses a configuration that would serve less protection than it asks
for (no token key and no explicit ``token.enabled = false``), reads and checks every key, certificate and
policy file, and compiles the rate-limit rules. :class:`Posture` is the summary both commands print.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from bastion._audit import Auditor
from bastion._cache_store import CacheStore, cache_store_from_settings
from bastion._metrics import NO_METRICS, Metrics
from bastion._tls import port_alpn, server_tls
from bastion._tls import posture as tls_posture
from bastion._tls import posture_line as tls_posture_line
from bastion.auth._capability import TokenAuthGuard
from bastion.auth._mtls import CredentialsGuard
from bastion.auth._posture import TokenPosture
from bastion.auth._revocation import Revocations
from bastion.config import Settings, read_file
from bastion.errors import ConfigError
from bastion.policy._capability import PolicyGuard, ResourceExtractor
from bastion.policy._normalize import Normalizer
from bastion.policy._posture import PolicyPosture
from bastion.ratelimit._buckets import RuleSet
from bastion.ratelimit._capability import RateLimitGuard, built_in_rate_limiting
from bastion.ratelimit._posture import RateLimitPosture
from bastion.resilience._capability import ResilienceGuard
from bastion.resilience._posture import ResiliencePosture
from bastion_core import mask_url

TOKEN_NOT_CONFIGURED = (
    "token authentication has no key: set token.public_key_path, token.secret, token.key_path or "
    "token.jwks_url, or token.enabled = false to serve every business route without a token"
)

log = structlog.get_logger("bastion.security")


def check_tls(full: Settings) -> None:
    """Refuse a certificate or key file that cannot be read or does not load (ConfigError naming the keys), then
    a set that fails the rotation checks (key matches, valid now, chain complete, client CA and CRL usable)."""
    settings = full.service
    if settings.tls_cert_path is None or settings.tls_key_path is None:
        return
    read_file("service.tls_cert_path", settings.tls_cert_path)
    read_file("service.tls_key_path", settings.tls_key_path)
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
            settings.tls_cert_path, settings.tls_key_path
        )
    except (ssl.SSLError, ValueError) as exc:
        raise ConfigError(
            f"service.tls_cert_path = {settings.tls_cert_path!r} and service.tls_key_path = "
            f"{settings.tls_key_path!r} are not a PEM certificate chain and its private key ({exc})"
        ) from None
    if full.tls.mtls:
        read_file("tls.client_ca_path", full.tls.client_ca_path or "")
        if full.tls.crl_path is not None:
            read_file("tls.crl_path", full.tls.crl_path)
    server_tls(full, alpn=port_alpn(full))


def not_applied(settings: Settings, resilience: Sequence[ResilienceGuard] | None = None) -> list[tuple[str, str]]:
    """``(key, reason)`` for settings nothing uses: warned about at start-up, never silent.

    ``resilience`` is the app's layers; ``None`` when they are unknown (``bastion check-config`` has no code to
    ask), and then the resilience keys are not judged.
    """
    found: list[tuple[str, str]] = []
    if resilience is not None:
        has_breaker = any(layer.breaker is not None for layer in resilience)
        has_bulkhead = any(layer.bulkhead is not None for layer in resilience)
        for key in sorted(settings.middleware.resilience.model_fields_set):
            used = has_breaker if key.startswith("circuit_breaker_") else has_bulkhead
            if not used:
                part = "circuit breaker" if key.startswith("circuit_breaker_") else "bulkhead"
                found.append(
                    (
                        f"middleware.resilience.{key}",
                        f"no resilience layer with a {part} uses it: add one with service.use_resilience()",
                    )
                )
    return found


@dataclass(kw_only=True)
class Security:
    """The security capabilities one configuration asks for, built and checked (ConfigError at start-up)."""

    settings: Settings
    cache_store: CacheStore
    revocations: Revocations
    auditor: Auditor
    token_auth: TokenAuthGuard | None
    credentials: CredentialsGuard | None
    """With ``tls.client_auth`` on: the token-auth step, choosing per path between token and client certificate."""
    policy: PolicyGuard | None
    rate_limiting: RateLimitGuard | None

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        realm: str,
        normalizer: Normalizer | None = None,
        extractors: Mapping[str, ResourceExtractor] | None = None,
        metrics: Metrics = NO_METRICS,
        limiter_follows_token_auth: bool = True,
    ) -> Security:
        """Build token auth, policy and rate limiting from ``settings``; refuse what would leave the door open.

        ``limiter_follows_token_auth``: no operator layer sits between the two steps (``Slot.TOKEN_AUTH``), so with
        revocation on and the distributed limiter on Redis/Valkey the revocation check rides in the limiter's
        round trip (one script instead of two commands per request).

        Raises ConfigError: no token key and no explicit ``token.enabled = false`` (TOKEN_NOT_CONFIGURED),
        an unreadable or unfit key or certificate, a policy file that does not parse, a bad route rule.
        """
        if settings.token.enabled is None and not settings.token.key_sources:
            raise ConfigError(TOKEN_NOT_CONFIGURED)
        check_tls(settings)
        if settings.policy.active and settings.policy.cache_backend == "cache_store" and not settings.cache_store.url:
            raise ConfigError(
                'policy.cache_backend = "cache_store" shares decisions through the cache store, but cache_store.url '
                'is not set: set it (or SERVICE_CACHE_STORE_URL), or use cache_backend = "memory"'
            )
        cache_store = cache_store_from_settings(settings.cache_store)
        revocations = Revocations(cache_store)
        auditor = Auditor(settings.audit)
        rate_limiting = built_in_rate_limiting(
            settings.rate_limit, cache_store=cache_store, auditor=auditor, metrics=metrics
        )
        if rate_limiting is None:
            RuleSet.from_settings(settings.rate_limit)  # route patterns are checked whoever wires the limiter
        token_auth = (
            TokenAuthGuard(
                settings.token,
                revocations=revocations,
                realm=realm,
                metrics=metrics,
                defer_revocation=limiter_follows_token_auth
                and rate_limiting is not None
                and rate_limiting.checks_revocation,
            )
            if settings.token.active
            else None
        )
        policy = (
            PolicyGuard(
                settings.policy,
                auditor=auditor,
                trust_forwarded=settings.rate_limit.trust_forwarded_headers,
                normalizer=normalizer,
                extractors=extractors,
                cache_store=cache_store,
                metrics=metrics,
            )
            if settings.policy.active
            else None
        )
        return cls(
            settings=settings,
            cache_store=cache_store,
            revocations=revocations,
            auditor=auditor,
            token_auth=token_auth,
            credentials=CredentialsGuard(settings.tls, token=token_auth) if settings.tls.mtls else None,
            policy=policy,
            rate_limiting=rate_limiting,
        )

    def posture(
        self,
        *,
        custom_layers: Mapping[str, int] | None = None,
        grpc_services: int = 0,
        resilience: Sequence[ResilienceGuard] | None = None,
    ) -> Posture:
        """What protects the service with these settings (and the operator's own layers, when known)."""
        settings = self.settings
        revocation = "off"
        if self.token_auth is not None and self.token_auth.revocations is not None:
            revocation = "cache_store" if settings.cache_store.url is not None else "memory"
        return Posture(
            token=TokenPosture.of(settings.token, enabled=self.token_auth is not None),
            policy=PolicyPosture.of(
                settings.policy, statements=None if self.policy is None else self.policy.policies.statements
            ),
            rate_limit=RateLimitPosture.of(settings.rate_limit, built_in=self.rate_limiting is not None),
            revocation=revocation,
            broker=BrokerPosture.of(settings),
            metrics=_metrics(settings),
            api_docs="public" if settings.service.api_docs_public else "token",
            grpc=_grpc(settings),
            grpc_services=grpc_services,
            tls=settings.service.tls_cert_path is not None,
            tls_settings=tls_posture(settings),
            tls_line=tls_posture_line(settings),
            custom_layers={slot: count for slot, count in (custom_layers or {}).items() if count},
            resilience=tuple(
                ResiliencePosture(
                    name=layer.name, breaker=layer.breaker is not None, bulkhead=layer.bulkhead is not None
                )
                for layer in resilience or ()
            ),
            not_applied=not_applied(settings, resilience),
        )

    async def aclose(self) -> None:
        await self.cache_store.close()


def _metrics(settings: Settings) -> str:
    if not settings.metrics.enabled:
        return "off"
    where = settings.metrics
    if where.port is not None:
        return f"port {where.port} {where.path}"
    return f"{'public' if where.public else 'token'} {where.path}"


def _grpc(settings: Settings) -> str:
    if not settings.grpc.enabled:
        return "off"
    return f"separate_port:{settings.grpc.port}" if settings.grpc.use_separate_port else "same_port"


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerPosture:
    """The broker as configured: its URL (credentials masked), whether ``/ready`` needs it, lazy start."""

    enabled: bool
    url: str = ""
    optional: bool = False
    lazy_init: bool = False

    @classmethod
    def of(cls, settings: Settings) -> BrokerPosture:
        broker = settings.broker
        if broker is None or not broker.active or broker.url is None:
            return cls(enabled=False)
        return cls(
            enabled=True,
            url=mask_url(broker.url.get_secret_value(), cluster=True),
            optional=broker.optional,
            lazy_init=broker.lazy_init,
        )

    def fields(self) -> dict[str, Any]:
        if not self.enabled:
            return {"enabled": False}
        return {"enabled": True, "url": self.url, "optional": self.optional, "lazy_init": self.lazy_init}

    def line(self) -> str:
        if not self.enabled:
            return "broker: off"
        return f"broker: {self.url} ({'optional' if self.optional else 'required'} for /ready)"


@dataclass(frozen=True, kw_only=True)
class Posture:
    """A summary of what protects a service: one structured log line at start-up, lines in check-config.

    Each capability describes itself with its own typed record (``TokenPosture``, ``PolicyPosture``,
    ``RateLimitPosture``, ``ResiliencePosture``): its log fields and its check-config line.
    """

    token: TokenPosture
    policy: PolicyPosture
    rate_limit: RateLimitPosture
    revocation: str
    grpc: str
    broker: BrokerPosture = BrokerPosture(enabled=False)
    metrics: str = "off"
    """``public <path>``, ``token <path>`` (behind token auth and policy), ``port <n> <path>`` or ``off``."""
    api_docs: str = "public"
    """``public``: each version's docs and OpenAPI document need no token or policy; ``token``: like any route."""
    grpc_services: int = 0
    tls: bool = False
    tls_settings: dict[str, Any] | None = None
    """With TLS: client certificates, CRL, identity order, credentials per path, reload interval (``bastion._tls``)."""
    tls_line: str = "tls: off"
    custom_layers: dict[str, int] = field(default_factory=dict)
    resilience: tuple[ResiliencePosture, ...] = ()
    not_applied: list[tuple[str, str]] = field(default_factory=list)

    def fields(self) -> dict[str, Any]:
        """The posture as log fields (``security_posture`` event)."""
        fields: dict[str, Any] = {
            "token": self.token.fields(),
            "policy": self.policy.fields(),
            "rate_limit": self.rate_limit.fields(),
            "revocation": self.revocation,
            "broker": self.broker.fields(),
            "grpc": self.grpc,
            "metrics": self.metrics,
            "api_docs": self.api_docs,
            "tls": self.tls,
        }
        if self.tls_settings is not None:
            fields["mtls"] = self.tls_settings
        if self.custom_layers:
            fields["custom_layers"] = self.custom_layers
        if self.resilience:
            fields["resilience"] = [layer.fields() for layer in self.resilience]
        return fields

    def log(self) -> None:
        """Log the posture once, and a warning for each setting that is not applied."""
        log.info("security_posture", **self.fields())
        for key, reason in self.not_applied:
            log.warning("config_not_applied", key=key, reason=reason)

    def lines(self) -> list[str]:
        """The posture for a person: one line per capability."""
        lines = [
            self.token.line(),
            self.policy.line(),
            self.rate_limit.line(),
            f"revocation: {self.revocation}",
            self.broker.line(),
            f"grpc: {self.grpc.replace('_', ' ')}",
            f"metrics: {self.metrics}",
            "api docs: "
            + (
                "public (<base_path>/v<N>/docs, /redoc, /openapi.json: no token, no policy decision)"
                if self.api_docs == "public"
                else "behind token auth and policy"
            ),
            self.tls_line,
        ]
        lines.extend(layer.line() for layer in self.resilience)
        if self.custom_layers:
            lines.append("operator layers: " + ", ".join(f"{slot} {n}" for slot, n in self.custom_layers.items()))
        lines.extend(f"not applied: {key}: {reason}" for key, reason in self.not_applied)
        return lines
