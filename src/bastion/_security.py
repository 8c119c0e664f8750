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
from bastion.auth._capability import TokenAuthGuard
from bastion.auth._formats import token_format
from bastion.auth._revocation import Revocations
from bastion.config import ServiceSettings, Settings, read_file
from bastion.errors import ConfigError
from bastion.policy._capability import PolicyGuard, ResourceExtractor
from bastion.policy._normalize import Normalizer
from bastion.ratelimit._buckets import RuleSet
from bastion.ratelimit._capability import RateLimiting, built_in_rate_limiting
from bastion.resilience._capability import ResilienceGuard
from bastion_core import mask_url

TOKEN_NOT_CONFIGURED = (
    "token authentication has no key: set token.public_key_path, token.secret, token.key_path or "
    "token.jwks_url, or token.enabled = false to serve every business route without a token"
)

log = structlog.get_logger("bastion.security")


def check_tls(settings: ServiceSettings) -> None:
    """Refuse a certificate or key file that cannot be read or does not load (ConfigError naming the keys)."""
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
    policy: PolicyGuard | None
    rate_limiting: RateLimiting | None

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
        check_tls(settings.service)
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
        token, policy, limits = settings.token, settings.policy, settings.rate_limit
        token_fields: dict[str, Any] = {"enabled": self.token_auth is not None}
        if self.token_auth is not None:
            token_fields["format"] = token.format
            label, value = token_format(token.format).label(token)
            token_fields[label] = value
            token_fields["key"] = f"token.{token.key_sources[0]}"
            if token.include_paths:
                token_fields["protected_paths"] = list(token.include_paths)
            else:
                token_fields["public_paths"] = [*token.exclude_paths, *token.public_paths]
        policy_fields: dict[str, Any] = {"enabled": self.policy is not None}
        if self.policy is not None:
            policy_fields.update(
                file=policy.policy_path,
                statements=self.policy.policies.statements,
                fail_open=policy.fail_open,
                hot_reload=policy.hot_reload,
            )
        mode = "off"
        if self.rate_limiting is not None:
            mode = "distributed" if limits.distributed else "local"
        elif limits.enabled and not limits.auto_apply:
            mode = "operator"
        limit_fields: dict[str, Any] = {"mode": mode}
        if self.rate_limiting is not None:
            limit_fields.update(
                per_user_rpm=limits.per_user_rpm,
                per_client_rpm=limits.per_client_rpm,
                per_ip_rpm=limits.per_ip_rpm,
                route_rules=len(limits.routes),
            )
        revocation = "off"
        if self.token_auth is not None and self.token_auth.revocations is not None:
            revocation = "cache_store" if settings.cache_store.url is not None else "memory"
        broker: dict[str, Any] = {"enabled": False}
        if settings.broker is not None and settings.broker.active and settings.broker.url is not None:
            broker = {
                "enabled": True,
                "url": mask_url(settings.broker.url.get_secret_value(), cluster=True),
                "optional": settings.broker.optional,
                "lazy_init": settings.broker.lazy_init,
            }
        metrics = "off"
        if settings.metrics.enabled:
            where = settings.metrics
            if where.port is not None:
                metrics = f"port {where.port} {where.path}"
            else:
                metrics = f"{'public' if where.public else 'token'} {where.path}"
        grpc = "off"
        if settings.grpc.enabled:
            grpc = f"separate_port:{settings.grpc.port}" if settings.grpc.use_separate_port else "same_port"
        return Posture(
            token=token_fields,
            policy=policy_fields,
            rate_limit=limit_fields,
            revocation=revocation,
            broker=broker,
            metrics=metrics,
            api_docs="public" if settings.service.api_docs_public else "token",
            grpc=grpc,
            grpc_services=grpc_services,
            tls=settings.service.tls_cert_path is not None,
            custom_layers={slot: count for slot, count in (custom_layers or {}).items() if count},
            resilience=[
                {"name": layer.name, "breaker": layer.breaker is not None, "bulkhead": layer.bulkhead is not None}
                for layer in resilience or ()
            ],
            not_applied=not_applied(settings, resilience),
        )

    async def aclose(self) -> None:
        await self.cache_store.close()


@dataclass(frozen=True, kw_only=True)
class Posture:
    """A summary of what protects a service: one structured log line at start-up, lines in check-config."""

    token: dict[str, Any]
    policy: dict[str, Any]
    rate_limit: dict[str, Any]
    revocation: str
    grpc: str
    broker: dict[str, Any] = field(default_factory=lambda: {"enabled": False})
    metrics: str = "off"
    """``public <path>``, ``token <path>`` (behind token auth and policy), ``port <n> <path>`` or ``off``."""
    api_docs: str = "public"
    """``public``: each version's docs and OpenAPI document need no token or policy; ``token``: like any route."""
    grpc_services: int = 0
    tls: bool = False
    custom_layers: dict[str, int] = field(default_factory=dict)
    resilience: list[dict[str, Any]] = field(default_factory=list)
    not_applied: list[tuple[str, str]] = field(default_factory=list)

    def fields(self) -> dict[str, Any]:
        """The posture as log fields (``security_posture`` event)."""
        fields: dict[str, Any] = {
            "token": self.token,
            "policy": self.policy,
            "rate_limit": self.rate_limit,
            "revocation": self.revocation,
            "broker": self.broker,
            "grpc": self.grpc,
            "metrics": self.metrics,
            "api_docs": self.api_docs,
            "tls": self.tls,
        }
        if self.custom_layers:
            fields["custom_layers"] = self.custom_layers
        if self.resilience:
            fields["resilience"] = self.resilience
        return fields

    def log(self) -> None:
        """Log the posture once, and a warning for each setting that is not applied."""
        log.info("security_posture", **self.fields())
        for key, reason in self.not_applied:
            log.warning("config_not_applied", key=key, reason=reason)

    def lines(self) -> list[str]:
        """The posture for a person: one line per capability."""
        token = self.token
        if token["enabled"]:
            what = token.get("algorithm") or f"PASETO {token['paseto']}"
            if "protected_paths" in token:
                paths = f"only {', '.join(token['protected_paths'])} need a token"
            elif token["public_paths"]:
                paths = f"every route needs a token except /health, /ready, {', '.join(token['public_paths'])}"
            else:
                paths = "every route needs a token except /health and /ready"
            token_line = f"token: {token['format']} {what}, key from {token['key']}; {paths}"
        else:
            token_line = "token: OFF (token.enabled = false): business routes need no token"
        policy = self.policy
        if policy["enabled"]:
            policy_line = (
                f"policy: {policy['file']}, {policy['statements']} statements, fail_open = "
                f"{str(policy['fail_open']).lower()}, hot reload {'on' if policy['hot_reload'] else 'off'}"
            )
        else:
            policy_line = "policy: off"
        limits = self.rate_limit
        if limits["mode"] in ("local", "distributed"):
            limit_line = (
                f"rate limit: {limits['mode']}, {limits['per_user_rpm']}/min per user, {limits['per_client_rpm']}/min "
                f"per client, {limits['per_ip_rpm']}/min per IP, {limits['route_rules']} route rules"
            )
        elif limits["mode"] == "operator":
            limit_line = "rate limit: wired by the operator (rate_limit.auto_apply = false)"
        else:
            limit_line = "rate limit: off"
        lines = [
            token_line,
            policy_line,
            limit_line,
            f"revocation: {self.revocation}",
            "broker: "
            + (
                f"{self.broker['url']} ({'optional' if self.broker['optional'] else 'required'} for /ready)"
                if self.broker["enabled"]
                else "off"
            ),
            f"grpc: {self.grpc.replace('_', ' ')}",
            f"metrics: {self.metrics}",
            "api docs: "
            + (
                "public (<base_path>/v<N>/docs, /redoc, /openapi.json: no token, no policy decision)"
                if self.api_docs == "public"
                else "behind token auth and policy"
            ),
            f"tls: {'on' if self.tls else 'off'}",
        ]
        for layer in self.resilience:
            parts = [part for part in ("breaker", "bulkhead") if layer[part]]
            lines.append(f"resilience {layer['name']}: {' + '.join(parts)}")
        if self.custom_layers:
            lines.append("operator layers: " + ", ".join(f"{slot} {n}" for slot, n in self.custom_layers.items()))
        lines.extend(f"not applied: {key}: {reason}" for key, reason in self.not_applied)
        return lines
