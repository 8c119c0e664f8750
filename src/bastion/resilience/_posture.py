"""What an inbound resilience layer says about itself in the security posture."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class ResiliencePosture:
    """One ``service.use_resilience(...)`` layer: its name and which of breaker and bulkhead it has."""

    name: str
    breaker: bool
    bulkhead: bool

    def fields(self) -> dict[str, Any]:
        """One entry of the ``resilience`` field of the ``security_posture`` log event."""
        return {"name": self.name, "breaker": self.breaker, "bulkhead": self.bulkhead}

    def line(self) -> str:
        """The ``resilience <name>:`` line of ``bastion check-config``."""
        parts = [part for part, present in (("breaker", self.breaker), ("bulkhead", self.bulkhead)) if present]
        return f"resilience {self.name}: {' + '.join(parts)}"
