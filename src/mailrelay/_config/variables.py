"""The MAIL_RELAY_* names as a list for people: ``mailrelay --help``'s table, and the refusal of a name no setting
reads (a misspelled variable is a setting silently left at its default)."""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence

from bastion_core import ConfigError
from mailrelay._config.converters import PREFIX
from mailrelay._config.descriptions import ALIASES, DESCRIPTIONS
from mailrelay._config.model import REMOVED_VARIABLES, REQUIRED_WITHOUT_ROUTES_FILE, VARIABLES, Settings


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """MAIL_RELAY_* names that no setting reads (most likely typos), sorted."""
    return sorted(name for name in environ if name.startswith(PREFIX) and name not in VARIABLES)


def refuse_unknown_variables(names: Sequence[str]) -> None:
    """Raise ConfigError for the first of ``names`` (unknown MAIL_RELAY_* variables), with the known name closest
    to it and the way to start anyway. A misspelled variable is a setting silently left at its default: the
    relay would start and do something else than the operator asked for."""
    if not names:
        return
    name = names[0]
    # compared without the shared prefix, which would make every name look close to every other
    known = sorted(variable.removeprefix(PREFIX) for variable in VARIABLES - REMOVED_VARIABLES)
    close = difflib.get_close_matches(name.removeprefix(PREFIX), known, n=1, cutoff=0.7)
    hint = f" (did you mean {PREFIX}{close[0]}?)" if close else ""
    more = f" ({len(names) - 1} more unknown)" if len(names) > 1 else ""
    raise ConfigError(
        f"{name}: not a MailRelay variable{hint}{more}; fix the name, or set {PREFIX}IGNORE_UNKNOWN_VARIABLES=true "
        "to start anyway"
    )


def variable_defaults() -> list[tuple[str, str, str]]:
    """``(variable, default as text, one-line description)`` for every setting (``mailrelay --help``): the required
    ones first, then in the order they are checked; a setting with an old name too is listed once, under its new
    name (:data:`~mailrelay._config.descriptions.ALIASES`)."""
    old_names = set(ALIASES.values())
    required: list[tuple[str, str, str]] = []
    optional: list[tuple[str, str, str]] = []
    for field_name, field in Settings.model_fields.items():
        name = str(field.validation_alias)
        if name in REMOVED_VARIABLES or field_name in old_names:
            continue
        default = field.default
        if field.is_required() or field_name in REQUIRED_WITHOUT_ROUTES_FILE:
            shown = "required"
        elif default is None:
            shown = "unset"
        elif isinstance(default, bool):
            shown = str(default).lower()
        elif isinstance(default, (str, tuple, frozenset)) and not default:
            shown = "empty"
        elif isinstance(default, (tuple, frozenset)):
            shown = ",".join(sorted(str(item) for item in default))
        else:
            shown = str(default)
        description = DESCRIPTIONS.get(field_name, "")
        if field_name in ALIASES:
            old = Settings.model_fields[ALIASES[field_name]].validation_alias
            description += f" (old name {old}, either works)"
        is_required = field.is_required() or field_name in REQUIRED_WITHOUT_ROUTES_FILE
        (required if is_required else optional).append((name, shown, description))
    return [*required, *optional]
