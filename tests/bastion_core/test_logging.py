"""The one logging set-up: JSON lines when asked (or when stderr is not a terminal), chatty loggers quieted."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = """
import logging, structlog
from bastion_core import configure_logging
configure_logging("debug", "{fmt}", quiet=("chatty",))
structlog.get_logger("app").info("thing_happened", answer=42)
logging.getLogger("chatty").info("dropped")
logging.getLogger("chatty").warning("kept")
"""


def run(fmt: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(fmt=fmt)], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout == ""
    return result.stderr.splitlines()


def test_json_lines_with_level_logger_and_timestamp() -> None:
    first, second = (json.loads(line) for line in run("json"))
    assert {k: first[k] for k in ("event", "answer", "level", "logger")} == {
        "event": "thing_happened",
        "answer": 42,
        "level": "info",
        "logger": "app",
    }
    assert first["timestamp"].endswith("Z")
    assert (second["event"], second["level"], second["logger"]) == ("kept", "warning", "chatty")


def test_auto_is_json_when_stderr_is_not_a_terminal() -> None:
    assert json.loads(run("auto")[0])["event"] == "thing_happened"


def test_console_is_one_readable_line_per_event() -> None:
    lines = run("console")
    assert len(lines) == 2
    assert "thing_happened" in lines[0] and "answer=42" in lines[0]
