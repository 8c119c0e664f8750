"""A route's own rate limit: ``@v2.post("/notes", rate_limit="10/minute")``, parsed when the route is registered."""

from __future__ import annotations

import re

from pydantic import ValidationError

from bastion.config import RouteRule
from bastion.errors import ConfigError

_RATE = re.compile(r"^\s*(?P<count>\d+)\s*(?:/|\s+per\s+)\s*(?P<unit>second|minute|hour|day)s?\s*$", re.IGNORECASE)


def parse_rate(text: object, *, route: str) -> RouteRule:
    """The ``[rate_limit.routes]`` entry ``"N/second"``, ``"N/minute"``, ``"N/hour"`` or ``"N/day"`` stands for
    (``"N per minute"`` too): one bucket per caller, burst ``N``. ConfigError naming ``route`` otherwise."""
    match = _RATE.match(text) if isinstance(text, str) else None
    if match is not None:
        try:
            return RouteRule.model_validate({f"requests_per_{match['unit'].lower()}": int(match["count"])})
        except ValidationError:
            pass  # a count of 0
    raise ConfigError(
        f"rate_limit={text!r} on {route}: expected 'N/second', 'N/minute', 'N/hour' or 'N/day' with N a "
        "positive whole number, e.g. '10/minute'"
    )
