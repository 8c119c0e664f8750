"""The request-limit tables: ``[rate_limit]`` (routes, plans) and ``[idempotency]``."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from bastion.config._values import Bool, PositiveInt, Section

StoreErrorMode = Literal["fail_closed", "local"]
"""What a rate-limit rule does while the cache store is down: refuse (500, the default) or count in this process."""

DEFAULT_IDEMPOTENCY_TTL_SECS = 86_400
DEFAULT_IDEMPOTENCY_KEY_LENGTH = 255
DEFAULT_IDEMPOTENCY_RESPONSE_BYTES = 1_048_576
DEFAULT_IDEMPOTENCY_MEMORY_BYTES = 64 * 1_048_576


class RouteRule(Section):
    """One ``[rate_limit.routes."<pattern>"]`` entry: one rate or several (per second, minute, hour, day: one
    window each, all charged together) and a burst (of the shortest window)."""

    requests_per_second: PositiveInt | None = None
    requests_per_minute: PositiveInt | None = None
    requests_per_hour: PositiveInt | None = None
    requests_per_day: PositiveInt | None = None
    burst_size: PositiveInt | None = None
    per_user: Bool = True
    on_store_error: StoreErrorMode | None = None
    """``None``: ``rate_limit.on_store_error``."""

    @model_validator(mode="after")
    def _some_rate(self) -> RouteRule:
        rates = [self.requests_per_second, self.requests_per_minute, self.requests_per_hour, self.requests_per_day]
        if all(rate is None for rate in rates):
            raise ValueError(
                "set at least one of requests_per_second, requests_per_minute, requests_per_hour, requests_per_day"
            )
        return self


class PlanSettings(Section):
    """One ``[rate_limit.plans.<name>]``: the global limits of callers whose ``plan_claim`` names this plan.

    ``per_user_rpm`` / ``per_client_rpm`` replace ``[rate_limit]``'s (unset: the same); ``per_second``,
    ``per_hour`` and ``per_day`` add windows to the caller's bucket, charged in the same check.
    """

    per_user_rpm: PositiveInt | None = None
    per_client_rpm: PositiveInt | None = None
    per_second: PositiveInt | None = None
    per_hour: PositiveInt | None = None
    per_day: PositiveInt | None = None
    burst_size: PositiveInt | None = None


class RateLimitSettings(Section):
    """``[rate_limit]``: per user, client and IP buckets with per-route rules and claim-selected plans."""

    enabled: Bool = True
    per_user_rpm: PositiveInt = 600
    per_client_rpm: PositiveInt = 1200
    per_ip_rpm: PositiveInt = 300
    window_secs: PositiveInt = 60
    burst_size: PositiveInt | None = None
    auto_apply: Bool = True
    distributed: Bool = False
    trust_forwarded_headers: Bool = False
    routes: dict[str, RouteRule] = Field(default_factory=dict)
    plan_claim: str | None = None
    """The token claim naming the caller's plan (``"plan"``): its ``[rate_limit.plans.<name>]`` limits apply."""
    plans: dict[str, PlanSettings] = Field(default_factory=dict)
    on_store_error: StoreErrorMode = "fail_closed"
    ietf_headers: Bool = False
    """Add the IETF ``RateLimit-Policy`` and ``RateLimit`` fields beside ``X-RateLimit-*``."""

    @model_validator(mode="after")
    def _plans_have_a_claim(self) -> RateLimitSettings:
        if self.plans and not self.plan_claim:
            raise ValueError("rate_limit.plans is set but rate_limit.plan_claim is not: name the claim, e.g. 'plan'")
        if self.plan_claim and not self.plans:
            raise ValueError(f"rate_limit.plan_claim = {self.plan_claim!r} but rate_limit.plans has no plan")
        return self


class IdempotencySettings(Section):
    """``[idempotency]``: ``Idempotency-Key`` handling on the routes listed here and those registered with
    ``idempotency=True`` (docs/idempotency.md)."""

    routes: list[str] = Field(default_factory=list)
    """Route patterns as in ``[rate_limit.routes]``: ``"POST /api/*/documents"``, ``"POST /**"``."""
    required: Bool = True
    """A request to one of the routes without the header gets 400; ``false``: it runs without idempotency."""
    ttl_secs: PositiveInt = DEFAULT_IDEMPOTENCY_TTL_SECS
    in_flight_secs: PositiveInt = 60
    """How long a request's claim on its key lasts while it runs (a crashed instance frees the key after it)."""
    max_key_length: Annotated[int, Field(ge=1, le=1024)] = DEFAULT_IDEMPOTENCY_KEY_LENGTH
    max_response_bytes: PositiveInt = DEFAULT_IDEMPOTENCY_RESPONSE_BYTES
    on_store_error: Literal["fail_closed", "fail_open"] = "fail_closed"
    """While the cache store is down: 503 without running the handler, or run it without idempotency."""
    memory_max_bytes: PositiveInt = DEFAULT_IDEMPOTENCY_MEMORY_BYTES
    """Without ``cache_store.url``: the records' bytes held in this process; past it the oldest are forgotten."""
