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


BATCHED = """
import asyncio, json, sys, structlog
from bastion_core import configure_logging
from bastion_core._logging import log_event

class Recorder:
    def __init__(self):
        self.writes = []
    def write(self, text):
        self.writes.append(text)
    def flush(self):
        pass
    def isatty(self):
        return False

recorder = Recorder()
sys.stderr = recorder
configure_logging("info", "json")
log = structlog.get_logger("bastion.access")

async def burst(count, first):
    for number in range(first, first + count):
        log_event(log, "bastion.access", "http_request", {{"n": number, "pad": "x" * 200}})
    log.error("after_the_burst")
    await asyncio.sleep(0)

asyncio.run(burst({count}, 0))
# A loop closed before its flush ran: the lines wait for the next loop's flush (or exit), none is lost.
stranded = asyncio.new_event_loop()
asyncio.events._set_running_loop(stranded)
log_event(log, "bastion.access", "http_request", {{"n": "stranded"}})
asyncio.events._set_running_loop(None)
stranded.close()
asyncio.run(burst(1, {count}))
log_event(log, "bastion.access", "http_request", {{"n": "outside a loop"}})
sys.__stdout__.write(json.dumps(recorder.writes))
"""


def test_access_lines_are_written_together_in_order_in_whole_lines_of_at_most_pipe_buf() -> None:
    """Inside an event loop the access-log lines of one loop iteration leave in as few writes as fit in
    ``PIPE_BUF`` (4096 bytes: a write to a pipe that several workers share is never split); any other line
    first writes the pending ones, so the order is kept; a closed loop or the absence of one loses nothing."""
    result = subprocess.run(
        [sys.executable, "-c", BATCHED.format(count=40)], capture_output=True, text=True, timeout=60, check=True
    )
    writes = json.loads(result.stdout)
    assert all(len(text.encode()) <= 4096 and text.endswith("\n") for text in writes)
    lines = [json.loads(line) for text in writes for line in text.splitlines()]
    assert [line.get("n", line["event"]) for line in lines] == [
        *range(40),
        "after_the_burst",
        "stranded",
        40,
        "after_the_burst",
        "outside a loop",
    ]
    assert len(writes) < 20  # 41 lines of about 300 bytes: about 13 per write, not one write each
    stamps = [line["timestamp"] for line in lines if line["event"] == "http_request"]
    assert all(len(stamp) == 27 and stamp[10] == "T" and stamp.endswith("Z") for stamp in stamps)


SNAPSHOT = """
import asyncio, structlog
from bastion_core import configure_logging
from bastion_core._logging import log_event
configure_logging("info", "json")
log = structlog.get_logger("bastion.access")

async def main():
    cases = [
        {{"sub": "field-wins", "n": 1}},
        {{"n": 2, "level": "debug"}},
        {{"n": 3, "extra": {{"quote": 'a"b', "ü": [1.25, None]}}}},
    ]
    for fields in cases:
        with structlog.contextvars.bound_contextvars(request_id="rid-1", sub="from-context", logger="ctx"):
            log.info("http_request", **dict(fields))
            log_event(log, "bastion.access", "http_request", fields)
    await asyncio.sleep(0.05)  # the last line is rendered here, its context long unbound

asyncio.run(main())
"""


def test_a_deferred_line_is_structlogs_line_with_the_context_of_when_it_was_logged() -> None:
    """The access line is rendered after the response, from the context snapshot taken when it was logged: the
    same keys in the same order and the same values as structlog's line, whatever the fields and the context
    hold (a field shadowing a context variable, a context variable or field named like the tail's keys)."""
    result = subprocess.run(
        [sys.executable, "-c", SNAPSHOT.format()],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    lines = [json.loads(line) for line in result.stderr.splitlines()]
    # structlog's line is written at once, after the pending direct line of the case before (rendered then)
    structlogs, direct = lines[0::2], lines[1::2]
    assert len(structlogs) == len(direct) == 3
    for expected, got in zip(structlogs, direct, strict=True):
        assert expected.pop("timestamp").endswith("Z") and got.pop("timestamp").endswith("Z")
        assert list(got.items()) == list(expected.items())
    assert direct[0]["sub"] == "field-wins" and direct[0]["request_id"] == "rid-1"
    assert (direct[1]["level"], direct[1]["logger"]) == ("info", "bastion.access")
    assert direct[2]["extra"] == {"quote": 'a"b', "ü": [1.25, None]}
