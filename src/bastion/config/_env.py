"""``SERVICE_*`` environment overrides: which key a variable names, and the value its string stands for."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

import structlog
from dotenv.parser import parse_stream
from pydantic import (
    BaseModel,
)

from bastion.config._sections import AppTable, ServiceSettings, Settings, TokenSettings
from bastion.config._values import Section
from bastion.errors import ConfigError

ENV_PREFIX = "SERVICE_"
APP_ENV_PREFIX = "SERVICE_APP_"
"""The app's own settings (``[app]``): read with the app's model when the service is built (``_app``)."""

log = structlog.get_logger("bastion.config")


def sections(
    model: type[BaseModel], path: tuple[str, ...] = (), *, kind: type[BaseModel] = Section
) -> Iterable[tuple[tuple[str, ...], type[BaseModel]]]:
    """``model`` and every table below it (fields whose type is a ``kind`` model), with their key paths."""
    yield path, model
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if get_origin(annotation) is dict:
            continue  # a table of tables ([rate_limit.routes."..."], [broker.streams.NAME]): the file only
        candidates = getattr(annotation, "__args__", (annotation,))
        for candidate in candidates:
            if isinstance(candidate, type) and issubclass(candidate, kind) and candidate is not AppTable:
                yield from sections(candidate, (*path, name), kind=kind)


def env_sections(
    found: Iterable[tuple[tuple[str, ...], type[BaseModel]]],
) -> list[tuple[str, tuple[str, ...], type[BaseModel]]]:
    """``(joined name, path, model)`` of each table but the root, longest name first (how variables are split)."""
    return sorted(
        (("_".join(path), path, model) for path, model in found if path),
        key=lambda item: len(item[0]),
        reverse=True,
    )


# Env names are matched against section names longest first, so keys containing "_" work:
# SERVICE_RATE_LIMIT_PER_USER_RPM -> rate_limit.per_user_rpm, SERVICE_MIDDLEWARE_CORS_MAX_AGE ->
# middleware.cors.max_age. The [service] section's own keys have no section part: SERVICE_PORT.
_ENV_SECTIONS = env_sections([*sections(Settings), (("jwt",), TokenSettings)])


_ENV_TRUE, _ENV_FALSE = frozenset({"true", "1"}), frozenset({"false", "0"})


def _base_types(annotation: object) -> set[object]:
    """The plain types an annotation admits: ``Annotated[bool, ...] | None`` -> ``{bool, NoneType}``."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _base_types(get_args(annotation)[0])
    if origin is UnionType or origin is Union:
        return {kind for arg in get_args(annotation) for kind in _base_types(arg)}
    return {annotation}


def env_value(model: type[BaseModel], key: str, raw: str) -> object:
    """The value an environment string stands for, by the key's type: list, bool (true/false/1/0) or as is."""
    annotation = model.model_fields[key].annotation
    kinds = _base_types(annotation)
    if getattr(annotation, "__origin__", None) is list:
        stripped = raw.strip()
        if stripped.startswith("["):
            return json.loads(stripped)
        return [item.strip() for item in stripped.split(",") if item.strip()]
    if bool in kinds:
        lowered = raw.strip().lower()
        if lowered in _ENV_TRUE:
            return True
        if lowered in _ENV_FALSE:
            return False
    return raw


def env_overrides(environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[tuple[str, ...], str]]:
    """Nested overrides from ``SERVICE_*`` variables and, for error messages, which variable set what."""
    overrides: dict[str, Any] = {}
    sources: dict[tuple[str, ...], str] = {}
    for name, raw in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX) or name.startswith(APP_ENV_PREFIX):
            continue
        rest = name[len(ENV_PREFIX) :].lower()
        target: tuple[tuple[str, ...], str, type[BaseModel]] | None = None
        for joined, path, model in _ENV_SECTIONS:
            if rest.startswith(joined + "_") and rest[len(joined) + 1 :] in model.model_fields:
                target = (path, rest[len(joined) + 1 :], model)
                break
        if target is None and rest in ServiceSettings.model_fields:
            target = (("service",), rest, ServiceSettings)
        if target is None:
            log.warning("unknown_environment_variable", variable=name)
            continue
        path, key, model = target
        if path == ("jwt",):
            path = ("token",)
        try:
            value = env_value(model, key, raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{name}={raw!r}: expected a JSON array or a comma-separated list ({exc.msg})") from None
        node = overrides
        for part in path:
            node = node.setdefault(part, {})
        node[key] = value
        sources[(*path, key)] = name
    return overrides, sources


DOTENV_FILE = ".env"


def dotenv_overrides(path: str | os.PathLike[str] = DOTENV_FILE) -> dict[str, str]:
    """The ``SERVICE_*`` variables of a ``.env`` file (none when there is no file).

    Read by the ``bastion`` command, which puts those not already in the environment into it: the process
    environment wins over ``.env``, which wins over the TOML file and the defaults. A line that is not
    ``NAME=value`` (``export NAME=value``, quotes and comments as in python-dotenv) is a ConfigError naming it.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {os.fspath(path)}: {exc}") from None
    found: dict[str, str] = {}
    for binding in parse_stream(io.StringIO(text)):
        if binding.error or (binding.key is not None and binding.value is None):
            line = binding.original.string.strip()
            raise ConfigError(f"{os.fspath(path)} line {binding.original.line}: expected NAME=value, got {line[:80]!r}")
        if binding.key is not None and binding.value is not None and binding.key.startswith(ENV_PREFIX):
            found[binding.key] = binding.value
    return found


def apply_dotenv() -> None:
    """``SERVICE_*`` variables from ``./.env`` into the environment, under those already set (and inherited by
    the workers of ``--workers N``)."""
    for name, value in dotenv_overrides().items():
        os.environ.setdefault(name, value)
