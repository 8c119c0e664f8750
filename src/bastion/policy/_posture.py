"""What policy authorization says about itself in the security posture (log line and ``bastion check-config``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bastion.config import PolicySettings


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyPosture:
    """Policy authorization as loaded: the file, how many statements, fail-open and hot reload."""

    enabled: bool
    file: str | None = None
    statements: int = 0
    fail_open: bool = False
    hot_reload: bool = False

    @classmethod
    def of(cls, policy: PolicySettings, *, statements: int | None) -> PolicyPosture:
        """``statements``: of the loaded policy set; ``None`` when policy authorization is off."""
        if statements is None:
            return cls(enabled=False)
        return cls(
            enabled=True,
            file=policy.policy_path,
            statements=statements,
            fail_open=policy.fail_open,
            hot_reload=policy.hot_reload,
        )

    def fields(self) -> dict[str, Any]:
        """The ``policy`` field of the ``security_posture`` log event."""
        if not self.enabled:
            return {"enabled": False}
        return {
            "enabled": True,
            "file": self.file,
            "statements": self.statements,
            "fail_open": self.fail_open,
            "hot_reload": self.hot_reload,
        }

    def line(self) -> str:
        """The ``policy:`` line of ``bastion check-config``."""
        if not self.enabled:
            return "policy: off"
        return (
            f"policy: {self.file}, {self.statements} statements, fail_open = {str(self.fail_open).lower()}, "
            f"hot reload {'on' if self.hot_reload else 'off'}"
        )
