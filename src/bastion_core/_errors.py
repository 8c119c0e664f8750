"""The configuration error both programs raise while their settings load (and never after)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A setting is missing or invalid. The message names the key (or variable) and the value, never a secret.

    Raised only at start-up; the command line prints it as one ``error: ...`` line and exits 2.
    """

    @classmethod
    def invalid(cls, key: str, value: str | None, expected: str) -> ConfigError:
        """``<key>: expected <expected>, got '<value>'`` (``<unset>`` for a missing value).

        ``value`` is shown as given: redact secrets before passing them (see :func:`bastion_core.mask_url`).
        """
        shown = "<unset>" if value is None else repr(value)
        return cls(f"{key}: expected {expected}, got {shown}")
