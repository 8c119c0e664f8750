"""The package's public surface."""

from __future__ import annotations

from types import ModuleType

import pytest

import mailrelay
import mailrelay.smtp
import mailrelay.testing


@pytest.mark.parametrize("module", [mailrelay, mailrelay.smtp, mailrelay.testing], ids=lambda m: m.__name__)
def test_all_is_sorted_and_resolvable(module: ModuleType) -> None:
    assert module.__all__ == sorted(module.__all__)
    for name in module.__all__:
        assert hasattr(module, name), name


def test_version_comes_from_the_distribution() -> None:
    assert mailrelay.__version__ and mailrelay.__version__ != "0.0.0+unknown"
