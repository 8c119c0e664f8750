"""What of the app's own settings may be shown: secret fields and secret-looking keys masked as Bastion's are."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, SecretBytes, SecretStr

from bastion_core import MASK, mask_url

_SECRET_NAME = re.compile(r"secret|password|passwd|token|api_?key|private_?key|credential", re.IGNORECASE)


def secret_name(name: str) -> bool:
    """Whether a key's name says it holds a secret (``db_password``, ``api_key``, ``webhook_secret``)."""
    return bool(_SECRET_NAME.search(name))


def _shown(value: object) -> object:
    """A secret's display: a URL keeps all but its password and query; anything else is the mask."""
    if isinstance(value, SecretStr):
        raw = value.get_secret_value()
        return mask_url(raw, cluster=True) if "://" in raw else MASK
    return MASK


def masked_app(settings: BaseModel) -> dict[str, Any]:
    """The app's validated settings as JSON data: ``SecretStr``/``SecretBytes`` fields and keys named like
    secrets (:func:`secret_name`) masked, passwords and queries of URLs in other strings masked."""
    dumped = settings.model_dump(mode="json")
    shown: dict[str, Any] = {}
    for name in type(settings).model_fields:
        value = getattr(settings, name)
        if isinstance(value, SecretStr | SecretBytes):
            shown[name] = _shown(value)
        elif value is not None and secret_name(name):
            shown[name] = MASK
        elif isinstance(value, BaseModel):
            shown[name] = masked_app(value)
        else:
            shown[name] = _masked_plain(dumped[name])
    return shown


def _masked_plain(value: object) -> object:
    if isinstance(value, str) and "://" in value:
        return mask_url(value)
    if isinstance(value, dict):
        return {key: MASK if secret_name(str(key)) else _masked_plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_masked_plain(item) for item in value]
    return value
