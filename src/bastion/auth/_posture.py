"""What token authentication says about itself in the security posture (log line and ``bastion check-config``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bastion.auth._formats import token_format
from bastion.config import TokenSettings


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenPosture:
    """Token authentication as configured: format, algorithm, where the key comes from, which paths need a token."""

    enabled: bool
    format: str = ""
    label: tuple[str, str] = ("", "")
    """The format's own description, ``("algorithm", "RS256")`` or ``("paseto", "v4.public")`` (its registry entry)."""
    description: str = ""
    """The algorithm as ``bastion check-config`` names it (``RS256``, ``PASETO v4.public``)."""
    key: str = ""
    protected_paths: tuple[str, ...] | None = None
    """``include_paths``: the only paths that need a token (``None``: every path but the public ones)."""
    public_paths: tuple[str, ...] = ()

    @classmethod
    def of(cls, token: TokenSettings, *, enabled: bool) -> TokenPosture:
        if not enabled:
            return cls(enabled=False)
        return cls(
            enabled=True,
            format=token.format,
            label=token_format(token.format).label(token),
            description=token_format(token.format).describe(token),
            key=f"token.{token.key_sources[0]}",
            protected_paths=tuple(token.include_paths) if token.include_paths else None,
            public_paths=(*token.exclude_paths, *token.public_paths),
        )

    def fields(self) -> dict[str, Any]:
        """The ``token`` field of the ``security_posture`` log event."""
        if not self.enabled:
            return {"enabled": False}
        fields: dict[str, Any] = {"enabled": True, "format": self.format, self.label[0]: self.label[1], "key": self.key}
        if self.protected_paths is not None:
            fields["protected_paths"] = list(self.protected_paths)
        else:
            fields["public_paths"] = list(self.public_paths)
        return fields

    def line(self) -> str:
        """The ``token:`` line of ``bastion check-config``."""
        if not self.enabled:
            return "token: OFF (token.enabled = false): business routes need no token"
        if self.protected_paths is not None:
            paths = f"only {', '.join(self.protected_paths)} need a token"
        elif self.public_paths:
            paths = f"every route needs a token except /health, /ready, {', '.join(self.public_paths)}"
        else:
            paths = "every route needs a token except /health and /ready"
        return f"token: {self.format} {self.description}, key from {self.key}; {paths}"
