"""What rate limiting says about itself in the security posture (log line and ``bastion check-config``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from bastion.config import RateLimitSettings

Mode = Literal["off", "local", "distributed", "operator"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RateLimitPosture:
    """Rate limiting as wired: ``local`` or ``distributed`` (built in, with its quotas), ``operator`` (wired by
    hand with ``rate_limit.auto_apply = false``) or ``off``."""

    mode: Mode
    per_user_rpm: int = 0
    per_client_rpm: int = 0
    per_ip_rpm: int = 0
    route_rules: int = 0
    plans: tuple[str, ...] = ()

    @classmethod
    def of(cls, limits: RateLimitSettings, *, built_in: bool) -> RateLimitPosture:
        if not built_in:
            return cls(mode="operator" if limits.enabled and not limits.auto_apply else "off")
        return cls(
            mode="distributed" if limits.distributed else "local",
            per_user_rpm=limits.per_user_rpm,
            per_client_rpm=limits.per_client_rpm,
            per_ip_rpm=limits.per_ip_rpm,
            route_rules=len(limits.routes),
            plans=tuple(sorted(limits.plans)),
        )

    @property
    def built_in(self) -> bool:
        return self.mode in ("local", "distributed")

    def fields(self) -> dict[str, Any]:
        """The ``rate_limit`` field of the ``security_posture`` log event."""
        if not self.built_in:
            return {"mode": self.mode}
        fields: dict[str, Any] = {
            "mode": self.mode,
            "per_user_rpm": self.per_user_rpm,
            "per_client_rpm": self.per_client_rpm,
            "per_ip_rpm": self.per_ip_rpm,
            "route_rules": self.route_rules,
        }
        if self.plans:
            fields["plans"] = list(self.plans)
        return fields

    def line(self) -> str:
        """The ``rate limit:`` line of ``bastion check-config``."""
        if self.built_in:
            return (
                f"rate limit: {self.mode}, {self.per_user_rpm}/min per user, {self.per_client_rpm}/min per client, "
                f"{self.per_ip_rpm}/min per IP, {self.route_rules} route rules"
                + (f", plans {', '.join(self.plans)}" if self.plans else "")
            )
        if self.mode == "operator":
            return "rate limit: wired by the operator (rate_limit.auto_apply = false)"
        return "rate limit: off"
