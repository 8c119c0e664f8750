"""The value types of the settings (durations, strict booleans, ports) and the checks shared by several sections."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def _parse_duration(value: object) -> object:
    """Seconds from a number or a string such as ``"5s"``, ``"250ms"``, ``"1m"``, ``"7d"``."""
    if isinstance(value, str):
        match = _DURATION.match(value)
        if match is None:
            raise ValueError("expected a duration such as 5, '5s', '250ms' or '1m'")
        return float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    return value


Duration = Annotated[float, BeforeValidator(_parse_duration), Field(ge=0)]
PositiveDuration = Annotated[float, BeforeValidator(_parse_duration), Field(gt=0)]
# TOML has real booleans: ``enabled = "yes"`` is a mistake to report, not a value to guess at. Environment
# values (always strings) are converted by env_value, which accepts only true/false/1/0.
Bool = Annotated[bool, Strict()]
Port = Annotated[int, Field(ge=0, le=65535)]
PositiveInt = Annotated[int, Field(gt=0)]


class Section(BaseModel):
    """A TOML table: frozen, and an unknown key is an error."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def check_path_prefix(value: str) -> str:
    """An absolute URL path prefix, without its trailing slash (``/`` alone becomes ``""``)."""
    if not value.startswith("/") or "//" in value or any(c.isspace() for c in value):
        raise ValueError("expected an absolute URL path such as '/api'")
    return value.rstrip("/") if value != "/" else ""


_SUBJECT_TOKEN = re.compile(r"^[^\s.*>]+$")


def check_subject(subject: str, *, wildcards: bool) -> str:
    """A NATS subject: dot-separated non-empty tokens; ``*`` (one token) and a last ``>`` only with ``wildcards``."""
    tokens = subject.split(".")
    for index, token in enumerate(tokens):
        if _SUBJECT_TOKEN.match(token):
            continue
        if wildcards and (token == "*" or (token == ">" and index == len(tokens) - 1)):
            continue
        kind = (
            "a subject (tokens separated by dots; '*' and a last '>' as wildcards)"
            if wildcards
            else ("a subject without wildcards (tokens separated by dots)")
        )
        raise ValueError(f"{subject!r} is not {kind}")
    return subject
