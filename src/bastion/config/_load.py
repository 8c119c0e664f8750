"""Loading the settings: the TOML file, ``[jwt]`` as ``[token]``, relative paths, the environment, one error.

:func:`load_settings` raises :class:`~bastion_core.ConfigError` naming the file, the key (or the variable) and
the bad value; the service never starts half-configured.
"""

from __future__ import annotations

import difflib
import os
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    SecretStr,
    ValidationError,
)

from bastion.config._env import APP_ENV_PREFIX, env_overrides
from bastion.config._masking import masked_app
from bastion.config._sections import Settings
from bastion.errors import ConfigError
from bastion_core import MASK, mask_url


def _merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(dict(merged[key]), value)
        else:
            merged[key] = value
    return merged


def _fold_jwt_alias(data: dict[str, Any], origin: str) -> dict[str, Any]:
    """Accept ``[jwt]`` as the spec's other name for ``[token]``; a key set in both is an error."""
    if "jwt" not in data:
        return data
    jwt = data.pop("jwt")
    token = data.get("token", {})
    if not isinstance(jwt, dict) or not isinstance(token, dict):
        raise ConfigError(f"{origin}: [jwt] and [token] must be tables")
    both = sorted(set(jwt) & set(token))
    if both:
        raise ConfigError(f"{origin}: {', '.join(both)} set in both [jwt] and [token]; use one section")
    data["token"] = {**token, **jwt}
    return data


_SECRET_KEYS = frozenset({"secret", "url", "password"})

# Keys naming files: relative values in a config file are relative to that file's directory, so a config
# works from any working directory. (Values from SERVICE_* variables are relative to the working directory.)
PATH_KEYS: tuple[tuple[str, str], ...] = (
    ("service", "tls_cert_path"),
    ("service", "tls_key_path"),
    ("token", "public_key_path"),
    ("token", "jwks_path"),
    ("token", "key_path"),
    ("policy", "policy_path"),
    ("policy", "policies_path"),
    ("tls", "client_ca_path"),
    ("tls", "crl_path"),
    ("broker", "tls_cert_path"),
    ("broker", "tls_key_path"),
    ("broker", "tls_ca_path"),
)


def _resolve_paths(data: dict[str, Any], base: Path) -> dict[str, Any]:
    for section, key in PATH_KEYS:
        table = data.get(section)
        if isinstance(table, dict) and isinstance(table.get(key), str):
            path = Path(table[key]).expanduser()
            table[key] = str(path if path.is_absolute() else base / path)
    return data


def read_file(key: str, path: str) -> bytes:
    """The bytes of the file a config key names; ConfigError naming the key, the path and why it failed."""
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        reason = "no such file"
    except IsADirectoryError:
        reason = "is a directory, not a file"
    except PermissionError:
        reason = "permission denied"
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
    raise ConfigError(f"{key} = {path!r}: cannot read the file ({reason})")


def _secret_key(loc: tuple[str | int, ...]) -> bool:
    return bool(loc) and str(loc[-1]) in _SECRET_KEYS


def _describe(
    loc: tuple[str | int, ...],
    value: object,
    sources: Mapping[tuple[str, ...], str],
    secret: Callable[[tuple[str | int, ...]], bool] = _secret_key,
) -> str:
    key = ".".join(str(part) for part in loc)
    if isinstance(value, Mapping):
        return key
    shown = MASK if secret(loc) else repr(value)
    env = sources.get(tuple(str(part) for part in loc))
    return f"{env}={shown} ({key})" if env else f"{key} = {shown}"


def did_you_mean(loc: tuple[str | int, ...], root: type[BaseModel] = Settings, skip: int = 0) -> str:
    """``; did you mean 'section.key'?`` for an unknown key close to one its section has (else "").

    ``root`` is the model of ``loc[skip:]`` (the app's settings model for ``app.*`` keys, ``skip=1``).
    """
    model: Any = root
    for part in loc[skip:-1]:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        annotation = getattr(field, "annotation", None)
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return ""
        model = annotation
    close = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=1, cutoff=0.75)
    return f"; did you mean {'.'.join([*map(str, loc[:-1]), close[0]])!r}?" if close else ""


def config_error(
    exc: ValidationError,
    origin: str,
    sources: Mapping[tuple[str, ...], str],
    *,
    prefix: tuple[str, ...] = (),
    root: type[BaseModel] = Settings,
    secret: Callable[[tuple[str | int, ...]], bool] = _secret_key,
    problems: Sequence[str] = (),
) -> ConfigError:
    """One ConfigError listing every problem (``problems`` first): the key (or variable), the value, why.

    ``prefix``: where the validated model sits (``("app",)`` for the app's settings model, ``root``).
    """
    lines = list(problems)
    for error in exc.errors():
        loc = (*prefix, *error["loc"])
        if error["type"] == "extra_forbidden":
            lines.append(f"unknown key {'.'.join(str(p) for p in loc)!r}{did_you_mean(loc, root, len(prefix))}")
            continue
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] in ("bool_type", "bool_parsing"):
            message = "expected true or false"
        if loc:
            lines.append(f"{_describe(loc, error.get('input'), sources, secret)}: {message}")
        else:
            lines.append(message)
    return ConfigError(f"invalid configuration ({origin}): " + "; ".join(lines))


def load_settings(path: str | os.PathLike[str] | None = None, *, environ: Mapping[str, str] | None = None) -> Settings:
    """Read ``path`` (TOML; embedded defaults when ``None``), apply ``SERVICE_*`` overrides, validate.

    Raises ConfigError naming the file, key and bad value for a missing file, a TOML syntax error, an
    unknown key or a value of the wrong type or range.
    """
    environ = os.environ if environ is None else environ
    origin = "embedded defaults"
    data: dict[str, Any] = {}
    if path is not None:
        origin = str(path)
        try:
            raw = Path(path).read_bytes()
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {origin}") from None
        except OSError as exc:
            raise ConfigError(f"cannot read config file {origin}: {exc.strerror}") from None
        try:
            data = tomllib.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise ConfigError(f"config file {origin} is not UTF-8") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {origin} is not valid TOML: {exc}") from None
        data = _resolve_paths(_fold_jwt_alias(data, origin), Path(path).resolve().parent)
    table = data.pop("app", {})
    if not isinstance(table, dict):
        raise ConfigError(f"invalid configuration ({origin}): app = {table!r}: expected a table ([app])")
    overrides, sources = env_overrides(environ)
    merged = _merge(data, overrides)
    # Validated by the app's own model when the service is built (Service(settings=...), bastion.config._app).
    app_environ = {name: value for name, value in environ.items() if name.startswith(APP_ENV_PREFIX)}
    merged["app"] = {"table": table, "environ": app_environ, "origin": origin}
    try:
        return Settings.model_validate(merged)
    except ValidationError as exc:
        raise config_error(exc, origin, sources) from None


def masked(settings: Settings, *, app: BaseModel | None = None) -> dict[str, Any]:
    """The effective settings as plain data with secrets (and passwords in URLs) masked.

    ``app``: the app's validated settings (``BastionApp.app_settings``), shown masked as ``"app"``
    (:func:`bastion.config.masked_app`); the raw ``[app]`` table is never shown.
    """

    def walk(value: object) -> object:
        if isinstance(value, SecretStr):
            raw = value.get_secret_value()
            return mask_url(raw, cluster=True) if "://" in raw else MASK
        if isinstance(value, BaseModel):
            return {name: walk(getattr(value, name)) for name in type(value).model_fields}
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    result = walk(settings)
    assert isinstance(result, dict)
    del result["app"]
    if app is not None:
        result["app"] = masked_app(app)
    return result
