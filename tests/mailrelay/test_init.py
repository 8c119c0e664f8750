"""The package's public surface."""

from __future__ import annotations

import mailrelay


def test_all_is_sorted_and_resolvable() -> None:
    assert mailrelay.__all__ == sorted(mailrelay.__all__)
    for name in mailrelay.__all__:
        assert hasattr(mailrelay, name), name


def test_version_comes_from_the_distribution() -> None:
    assert mailrelay.__version__ and mailrelay.__version__ != "0.0.0+unknown"
