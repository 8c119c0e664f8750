"""The app's own settings: the ``[app]`` table and ``SERVICE_APP_*`` variables, validated by the app's model.

``Service(settings=MySettings)`` names a pydantic model; when the service is built, :func:`app_settings_from`
validates what the loader kept aside (``Settings.app``) into it, with the loader's error style: every problem
on the one ``invalid configuration (FILE): ...`` line, naming the key (``app.port``) or the variable. An unknown
key is refused as Bastion's own are (unless the model says ``extra="allow"``); an unknown ``SERVICE_APP_*``
variable is logged and ignored, as other ``SERVICE_*`` variables are.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, TypeVar, get_args

import structlog
from pydantic import BaseModel, SecretBytes, SecretStr, ValidationError

from bastion.config._env import APP_ENV_PREFIX, env_sections, env_value, sections
from bastion.config._load import config_error, did_you_mean
from bastion.config._masking import secret_name
from bastion.config._sections import AppTable
from bastion.errors import ConfigError

M = TypeVar("M", bound=BaseModel)

APP_SECTION = "app"
NO_APP_MODEL = (
    "unknown key 'app': the [app] table holds the app's own settings; declare their model with "
    "Service(settings=YourSettings) (a pydantic BaseModel)"
)

log = structlog.get_logger("bastion.config")


def _field_model(model: type[BaseModel], name: str) -> type[BaseModel] | None:
    annotation = model.model_fields[name].annotation
    for candidate in (annotation, *get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _names(model: type[BaseModel]) -> dict[str, str]:
    """Every key a model takes (field names and string aliases) -> the field's name."""
    names = {}
    for name, field in model.model_fields.items():
        names[name] = name
        for alias in (field.alias, field.validation_alias):
            if isinstance(alias, str):
                names[alias] = name
    return names


def _unknown_keys(
    model: type[BaseModel], table: Mapping[str, Any], path: tuple[str, ...], root: type[BaseModel]
) -> list[str]:
    """Keys the model would silently drop (pydantic's default ``extra="ignore"``): refused as Bastion's are."""
    extra = model.model_config.get("extra")
    if extra == "allow":
        return []
    known, problems = _names(model), []
    for key, value in table.items():
        name = known.get(key)
        if name is None:
            if extra == "forbid":
                continue  # the model's own validation reports it
            loc = (*path, key)
            problems.append(f"unknown key {'.'.join(loc)!r}{did_you_mean(loc, root, 1)}")
            continue
        inner = _field_model(model, name)
        if inner is not None and isinstance(value, Mapping):
            problems += _unknown_keys(inner, value, (*path, key), root)
    return problems


def _env_data(model: type[BaseModel], environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[tuple[str, ...], str]]:
    """Nested values from ``SERVICE_APP_<KEY>`` variables (tables joined with ``_``, matched longest first, as
    ``SERVICE_MIDDLEWARE_CORS_MAX_AGE`` is) and, for error messages, which variable set what."""
    tables = [*env_sections(sections(model, kind=BaseModel)), ("", (), model)]
    data: dict[str, Any] = {}
    sources: dict[tuple[str, ...], str] = {}
    for name, raw in sorted(environ.items()):
        rest = name[len(APP_ENV_PREFIX) :].lower()
        target = None
        for joined, path, table in tables:
            key = rest[len(joined) + 1 :] if joined else rest
            if (not joined or rest.startswith(joined + "_")) and key in table.model_fields:
                target = (path, key, table)
                break
        if target is None:
            log.warning("unknown_environment_variable", variable=name)
            continue
        path, key, table = target
        try:
            value = env_value(table, key, raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{name}=...: expected a JSON array or a comma-separated list ({exc.msg})") from None
        node = data
        for part in path:
            node = node.setdefault(part, {})
        node[key] = value
        sources[(APP_SECTION, *path, key)] = name
    return data, sources


def _merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _secret(model: type[BaseModel]) -> Any:
    def secret(loc: tuple[str | int, ...]) -> bool:
        """A value not to echo: a secret-looking key, or a SecretStr/SecretBytes field of the model."""
        if loc and secret_name(str(loc[-1])):
            return True
        current: type[BaseModel] | None = model
        for part in loc[1:]:
            if current is None or not isinstance(part, str) or part not in current.model_fields:
                return False
            annotation = current.model_fields[part].annotation
            if any(kind in (SecretStr, SecretBytes) for kind in (annotation, *get_args(annotation))):
                return True
            current = _field_model(current, part)
        return False

    return secret


def check_settings_model(model: object) -> type[BaseModel] | None:
    """``model`` when it is ``None`` or a pydantic model class (``Service(settings=...)``), else ConfigError."""
    if model is None or (isinstance(model, type) and issubclass(model, BaseModel)):
        return model
    raise ConfigError(f"Service(settings={model!r}): expected a pydantic model class (class MySettings(BaseModel))")


def app_settings_from(model: type[M] | None, app: AppTable) -> M | None:
    """The app's settings: ``[app]`` with ``SERVICE_APP_*`` over it (the environment wins), validated by ``model``.

    ``model`` ``None`` (no ``Service(settings=...)``): ``None``, and a non-empty ``[app]`` table is refused.
    Raises ConfigError naming every bad key or variable and its (masked) value, in the loader's style.
    """
    if model is None:
        if app.table:
            raise ConfigError(f"invalid configuration ({app.origin}): {NO_APP_MODEL}")
        for name in sorted(app.environ):
            log.warning("unknown_environment_variable", variable=name)
        return None
    problems = _unknown_keys(model, app.table, (APP_SECTION,), model)
    env, sources = _env_data(model, app.environ)
    data = _merge(app.table, env)
    try:
        settings = model.model_validate(data)
    except ValidationError as exc:
        raise config_error(
            exc, app.origin, sources, prefix=(APP_SECTION,), root=model, secret=_secret(model), problems=problems
        ) from None
    if problems:
        raise ConfigError(f"invalid configuration ({app.origin}): " + "; ".join(problems))
    return settings
