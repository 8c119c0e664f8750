"""MAIL_RELAY_* settings: the model and its loading (`model.py`) over each variable's converter (`converters.py`)."""

from mailrelay._config.converters import PREFIX, is_loopback_host, mask_nats_url
from mailrelay._config.model import (
    REMOVED_VARIABLES,
    VARIABLES,
    Settings,
    load_settings,
    parse_settings,
    read_environment,
    shown_value,
)
from mailrelay._config.variables import refuse_unknown_variables, unknown_variables, variable_defaults

__all__ = [
    "PREFIX",
    "REMOVED_VARIABLES",
    "VARIABLES",
    "Settings",
    "is_loopback_host",
    "load_settings",
    "mask_nats_url",
    "parse_settings",
    "read_environment",
    "refuse_unknown_variables",
    "shown_value",
    "unknown_variables",
    "variable_defaults",
]
