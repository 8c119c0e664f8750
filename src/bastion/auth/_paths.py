"""Which paths need a token: ``/health`` and ``/ready`` never; then include_paths, exclude_paths, public_paths."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from bastion._health import ALWAYS_PUBLIC
from bastion.errors import ConfigError


def _split(patterns: Iterable[str], key: str) -> tuple[frozenset[str], tuple[str, ...]]:
    """Exact paths and wildcard prefixes (``/docs/*`` -> ``/docs/``) from config patterns."""
    exact: set[str] = set()
    prefixes: list[str] = []
    for pattern in patterns:
        body = pattern[:-1] if pattern.endswith("/*") else pattern
        if not pattern.startswith("/") or "*" in body:
            raise ConfigError(f"{key}: {pattern!r} must be an absolute path, optionally ending in '/*'")
        if body is pattern:
            exact.add(pattern)
        else:
            prefixes.append(body)
    return frozenset(exact), tuple(prefixes)


def _prefix_list(prefixes: Iterable[str], key: str) -> tuple[str, ...]:
    cleaned = []
    for prefix in prefixes:
        if not prefix.startswith("/") or "*" in prefix:
            raise ConfigError(f"{key}: {prefix!r} must be an absolute path prefix")
        cleaned.append(prefix.rstrip("/"))
    return tuple(cleaned)


@dataclass(frozen=True, slots=True)
class PathRules:
    """Decide per canonical path whether a token is required (paths arrive canonical: see routing/_paths.py).

    - ``/health`` and ``/ready`` are always public.
    - ``exclude_paths`` lists public paths; ``include_paths`` lists the only protected ones (never both).
    - A pattern is an exact path or ends in ``/*``, which matches everything below that directory (not the
      directory itself: ``/docs/*`` matches ``/docs/a`` and ``/docs/a/b``, not ``/docs``).
    - ``public_paths`` are public prefixes matched on segment boundaries: ``/public`` matches ``/public`` and
      ``/public/x``, not ``/publicity``.
    """

    exact: frozenset[str]
    prefixes: tuple[str, ...]
    include_mode: bool
    public_prefixes: tuple[str, ...]

    @classmethod
    def from_settings(cls, *, include_paths: list[str], exclude_paths: list[str], public_paths: list[str]) -> PathRules:
        if include_paths and exclude_paths:
            raise ConfigError("token.include_paths and token.exclude_paths are both set; use one")
        key = "token.include_paths" if include_paths else "token.exclude_paths"
        exact, prefixes = _split(include_paths or exclude_paths, key)
        return cls(exact, prefixes, bool(include_paths), _prefix_list(public_paths, "token.public_paths"))

    def _listed(self, path: str) -> bool:
        return path in self.exact or path.startswith(self.prefixes)

    def requires_token(self, path: str) -> bool:
        if path in ALWAYS_PUBLIC:
            return False
        for prefix in self.public_prefixes:
            if path == prefix or path.startswith(prefix + "/"):
                return False
        if self.include_mode:
            return self._listed(path)
        return not self._listed(path)
