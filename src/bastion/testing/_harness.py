"""What a test client is built from: the settings with a generated token key wired in, the app, the minter.

A user's configuration names the key of their identity provider (a file they do not have in tests); the
client swaps in a key it generates, so the tokens ``as_user`` mints are the ones the built service accepts.
Only the key source changes: algorithm, format, issuer, audience, leeway, path rules and revocation stay.
"""

from __future__ import annotations

import importlib
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import SecretStr

from bastion.auth._formats import token_format
from bastion.config import Settings, TokenSettings, load_settings
from bastion.errors import ConfigError
from bastion.testing._tokens import PasetoMinter, TokenMinter

if TYPE_CHECKING:
    from bastion._app import BastionApp
    from bastion._service import Service

Minter = TokenMinter | PasetoMinter
KEY_FILE = "bastion-test-key"
_JWT_KEY_SOURCES = ("secret", "public_key_path", "jwks_path", "jwks_url")


@dataclass(frozen=True, slots=True, kw_only=True)
class Harness:
    """The built app, the settings it was built with, and what mints the tokens it accepts.

    ``minter`` is ``None`` when the client was told to keep the configured key and given no minter for it.
    ``claims`` are added to every token ``as_user`` mints (``iss``/``aud`` when the settings require them).
    """

    app: BastionApp
    settings: Settings
    minter: Minter | None
    claims: Mapping[str, Any] = field(default_factory=dict)

    def token(self, sub: str | None, *, roles: Iterable[str] = (), **claims: Any) -> str:
        """A token for ``sub`` that the app accepts (RuntimeError when the app checks no tokens)."""
        if not self.settings.token.active:
            raise RuntimeError(
                "token authentication is off in these settings (token.enabled = false): the service would ignore "
                "the token; test without as_user(), or leave token.enabled unset"
            )
        if self.minter is None:
            raise RuntimeError(
                "the client keeps the configured token key (replace_token_key=False) and has no minter for it: "
                "pass minter=TokenMinter.from_private_pem(...) with the matching private key"
            )
        return self.minter.mint(sub=sub, roles=roles, **{**self.claims, **claims})


def resolve_settings(
    *,
    settings: Settings | None,
    config: str | os.PathLike[str] | None,
    environ: Mapping[str, str] | None,
) -> Settings:
    """``settings`` as given, else ``config`` (or the embedded defaults) loaded with ``environ`` (not os.environ)."""
    if settings is not None:
        if config is not None or environ is not None:
            raise TypeError("pass settings=, or config= and/or environ=, not both: settings are already loaded")
        return settings
    return load_settings(config, environ=environ or {})


def _check_minter(token: TokenSettings, minter: Minter) -> None:
    if not minter.fits(token):
        raise ConfigError(token_format(token.format).wrong_minter(token))


def _with_key(token: TokenSettings, minter: Minter, folder: Path) -> TokenSettings:
    """``token`` with its key source replaced by ``minter``'s verification key (written to ``folder``)."""
    if isinstance(minter, PasetoMinter):
        path = folder / KEY_FILE
        path.write_bytes(minter.verification_key)
        return token.model_copy(update={"key_path": str(path)})
    cleared: dict[str, Any] = {name: None for name in _JWT_KEY_SOURCES if getattr(token, name) is not None}
    if token.algorithm.startswith("HS"):
        return token.model_copy(update={**cleared, "secret": SecretStr(minter.secret)})
    path = folder / KEY_FILE
    path.write_bytes(minter.public_pem())
    return token.model_copy(update={**cleared, "public_key_path": str(path)})


def _new_minter(token: TokenSettings) -> Minter:
    """A minter with a new key of the format's own kind (its registry entry names the factory)."""
    module, _, name = token_format(token.format).minter.partition(":")
    factory: Callable[[TokenSettings], Minter] = getattr(importlib.import_module(module), name)
    return factory(token)


def prepare(
    service: Service,
    settings: Settings,
    *,
    minter: Minter | None,
    replace_token_key: bool,
    broker: Literal["memory"] | None = None,
) -> Harness:
    """Build ``service`` for a test client (see the module docstring for what is replaced).

    The generated key's file exists only while the app is built: the app reads its keys once, at build time,
    so nothing is left behind however the client ends. With token authentication explicitly off
    (``token.enabled = false``) nothing is replaced. Raises ConfigError for settings the service refuses (as
    ``bastion run`` would) or a minter of another algorithm. ``broker="memory"``: the in-memory broker.
    """
    token = settings.token
    claims = {
        name: value
        for name, value in (("iss", token.required_issuer), ("aud", token.required_audience))
        if value is not None
    }
    if minter is not None and token.enabled is not False:
        _check_minter(token, minter)
    if token.enabled is False or not replace_token_key:
        return Harness(app=service.build(settings, broker=broker), settings=settings, minter=minter, claims=claims)
    minter = minter or _new_minter(token)
    with tempfile.TemporaryDirectory(prefix="bastion-test-") as folder:
        settings = settings.model_copy(update={"token": _with_key(token, minter, Path(folder))})
        app = service.build(settings, broker=broker)
    return Harness(app=app, settings=settings, minter=minter, claims=claims)
