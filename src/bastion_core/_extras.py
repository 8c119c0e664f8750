"""Optional features and the extras that bring their packages: a configured feature whose extra is not installed
stops start-up with one line naming the extra (docs/installation.md).

Both programs list their extras as data (``bastion._extras``, ``mailrelay._extras``); the packages of an extra
are imported only where its feature is built, so importing either program without them works.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from bastion_core._errors import ConfigError


class MissingExtra(ConfigError):
    """A configured feature needs an extra that is not installed: ``[broker] needs the broker extra: pip install
    'bastion[broker]'``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Extra:
    """One extra of a distribution: its name, the modules it brings, and the setting that turns its feature on."""

    distribution: str
    name: str
    modules: tuple[str, ...]
    feature: str

    @property
    def install(self) -> str:
        return f"pip install '{self.distribution}[{self.name}]'"

    def missing(self) -> str | None:
        """The first of the extra's modules that does not import, or None when all do."""
        for module in self.modules:
            try:
                importlib.import_module(module)
            except ModuleNotFoundError:
                return module
        return None

    def require(self) -> None:
        """Raise MissingExtra (one line: the feature, the extra, the command installing it) unless installed."""
        if self.missing() is not None:
            raise MissingExtra(f"{self.feature} needs the {self.name} extra: {self.install}")
