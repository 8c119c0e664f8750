"""bastion_core._logging.info_dropped: True exactly when configure_logging's level drops info lines and its processors
are in use (checked in a fresh interpreter each, so the suite's logging set-up is not touched)."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import structlog, structlog.testing
from bastion_core import configure_logging
from bastion_core._logging import info_dropped
configure_logging("{level}", "json")
with structlog.testing.capture_logs():
    captured = info_dropped()
print(info_dropped(), captured)
"""


@pytest.mark.parametrize(("level", "expected"), [("warning", "True False"), ("info", "False False")])
def test_info_is_dropped_only_above_info_and_never_while_captured(level: str, expected: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE.format(level=level)], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == expected
