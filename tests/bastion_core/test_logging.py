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


DIRECT = """
import structlog
from bastion_core import configure_logging
from bastion_core._logging import log_event
configure_logging("{level}", "{fmt}")
log = structlog.get_logger("bastion.access")
structlog.contextvars.bind_contextvars(request_id="rid-1")
fields = {{"method": "GET", "route": None, "status": 404, "duration_ms": 1.5, "sub": "ü"}}
log.info("http_request", **fields)
log_event(log, "bastion.access", "http_request", fields)
"""


def run_direct(fmt: str, level: str = "info") -> list[str]:
    result = subprocess.run(
        [sys.executable, "-c", DIRECT.format(fmt=fmt, level=level)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return result.stderr.splitlines()


def test_the_direct_line_is_structlogs_line() -> None:
    """The access log's one-step writer: the same keys in the same order, the same values, as structlog's."""
    through_structlog, direct = (json.loads(line) for line in run_direct("json"))
    assert through_structlog.pop("timestamp").endswith("Z") and direct.pop("timestamp").endswith("Z")
    assert list(direct.items()) == list(through_structlog.items())
    assert direct == {
        "method": "GET",
        "route": None,
        "status": 404,
        "duration_ms": 1.5,
        "sub": "ü",
        "event": "http_request",
        "request_id": "rid-1",
        "level": "info",
        "logger": "bastion.access",
    }


def test_the_direct_line_follows_the_console_format_and_the_level() -> None:
    console = run_direct("console")
    assert len(console) == 2 and all("http_request" in line and "request_id=rid-1" in line for line in console)
    assert run_direct("json", level="warning") == []
