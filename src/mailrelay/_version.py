"""The installed release, for `--version` and the webhook's User-Agent."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("mailrelay")  # the mailrelay distribution (pip install mailrelay)
except PackageNotFoundError:
    try:
        __version__ = version("bastion")  # the repository's development install, which holds every package
    except PackageNotFoundError:  # running from a source tree that was never installed
        __version__ = "0.0.0+unknown"
