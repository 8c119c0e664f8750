"""One logging set-up for both programs: structlog key-value events, JSON in production, console in development.

Our own events (``structlog.get_logger(...)``) take structlog's native path: a bound logger, the processors
(the first drops events below the level), and one write of the rendered line; no ``logging.LogRecord``, no
handler lock, no formatter. Events of other libraries (``logging.getLogger(...)``: uvicorn, nats, aiohttp) go
through a stdlib handler that renders them with the same processors, so every line has one shape.
JSON is rendered with orjson (about a quarter of the standard library's cost per line).
"""

from __future__ import annotations

import atexit
import datetime
import logging
import sys
import time
import traceback
from collections.abc import Iterable, MutableMapping
from typing import Any, TextIO

import orjson
import structlog

from bastion_core._loop import running_loop

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}
UNKNOWN_VARIABLE_EVENT = "unknown_environment_variable"
"""The warning both programs log for an environment variable with their prefix that names no setting."""


class LineLogger:
    """structlog's final logger: writes each rendered event as one line to stderr (looked up per line, so a
    test or a supervisor that swaps ``sys.stderr`` gets the lines)."""

    __slots__ = ("name",)

    def __init__(self, name: str = "") -> None:
        self.name = name

    def msg(self, line: str) -> None:
        _write_pending(line + "\n")  # access-log lines waiting for the end of the loop iteration go first

    debug = info = warning = warn = error = critical = exception = log = msg


def _line_logger(*args: Any) -> LineLogger:
    return LineLogger(str(args[0]) if args else "")


def _add_logger_name(logger: Any, method: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    record = event_dict.get("_record")
    name = record.name if record is not None else getattr(logger, "name", "")
    if name:
        event_dict["logger"] = name
    return event_dict


_threshold = {"level": logging.INFO}
_METHOD_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "exception": logging.ERROR,
    "critical": logging.CRITICAL,
}


def _below_threshold(logger: Any, method: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Drop events below the configured level (a processor rather than a filtering wrapper class, so loggers
    cached before a later ``configure_logging`` follow the new level, and ``structlog.testing.capture_logs``
    sees every event)."""
    if _METHOD_LEVELS.get(method, logging.INFO) < _threshold["level"]:
        raise structlog.DropEvent
    return event_dict


def _orjson(value: Any, **kwargs: Any) -> str:
    return orjson.dumps(value, default=kwargs.get("default", str)).decode()


def exception_text(exc: BaseException) -> str:
    """``exc``'s traceback as ``format_exc_info`` writes it, for the ``exception`` field of a log event: never the
    frames' locals, whatever renderer the process has (structlog unconfigured, as in a test run, renders ``exc_info``
    with every local, a request's headers and its bearer token among them)."""
    return "".join(traceback.format_exception(exc)).rstrip("\n")


def configure_logging(level: str = "info", fmt: str = "auto", *, quiet: Iterable[str] = ()) -> None:
    """Route structlog and stdlib logging through one renderer on stderr.

    ``fmt`` is ``json`` (production), ``console`` (development) or ``auto``: console when stderr is a
    terminal, JSON otherwise. Context variables bound per request or session (request id, sub, route)
    appear on every line logged meanwhile. Loggers named in ``quiet`` (chatty libraries) log from WARNING
    up only.
    """
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    number = LEVELS.get(level.lower(), logging.INFO)
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        _add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Any = (
        structlog.processors.JSONRenderer(serializer=_orjson)
        if use_json
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    _threshold["level"] = number
    processors = [_below_threshold, *shared, structlog.processors.format_exc_info, renderer]
    _direct.update(json=use_json, processors=processors)
    structlog.configure(
        processors=processors,
        logger_factory=_line_logger,
        wrapper_class=structlog.make_filtering_bound_logger(logging.NOTSET),
        cache_logger_on_first_use=settings["cache_loggers"],
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            renderer,
        ],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(number)
    for name in quiet:
        logging.getLogger(name).setLevel(max(number, logging.WARNING))


_direct: dict[str, Any] = {"json": False, "processors": None}
settings: dict[str, Any] = {"cache_loggers": True}
"""``cache_loggers``: a logger binds its processors on first use (structlog's ``cache_logger_on_first_use``), as a
server wants. A test process that configures logging again and again (commands run in-process) turns it off, so
a later ``structlog.testing.capture_logs`` sees every logger."""
_UTC = datetime.UTC
_pending: list[str] = []
"""Rendered access-log lines (each ending in a newline) not yet written: flushed at the end of the event-loop
iteration that produced them, before any other line, at exit, or as soon as they would exceed ``_CHUNK``."""
_state: dict[str, Any] = {"bytes": 0, "loop": None, "second": -1, "prefix": ""}
"""``loop``: the event loop a flush is scheduled on (a loop closed before running it leaves the lines to the next
loop's flush or to exit)."""
_CHUNK = 4096
FLUSH_DELAY_SECS = 0.002
"""How long an access-log line may wait for others to share its write."""
"""POSIX ``PIPE_BUF``: one write of at most this many bytes to a pipe is never interleaved with another
process's write (``--workers N`` share the supervisor's stderr), so no line is ever split."""


def _flush_pending() -> None:
    _state["loop"] = None
    _write_pending()


def _write_pending(line: str = "") -> None:
    """Write the pending lines, then ``line``, in one write."""
    if _pending:
        taken = _pending[:]
        del _pending[: len(taken)]  # not clear(): a line another thread appends meanwhile stays for the next write
        line = "".join(taken) + line
        _state["bytes"] = 0
    if line:
        stream: TextIO = sys.stderr
        stream.write(line)
        stream.flush()


atexit.register(_flush_pending)


def _timestamp() -> str:
    """``TimeStamper(fmt="iso", utc=True)``'s value (with the microseconds always present), formatted once per
    second rather than once per line."""
    now = time.time()
    second = int(now)
    if second != _state["second"]:
        _state["prefix"] = datetime.datetime.fromtimestamp(second, _UTC).strftime("%Y-%m-%dT%H:%M:%S.")
        _state["second"] = second
    return f"{_state['prefix']}{int((now - second) * 1_000_000):06d}Z"


def info_dropped() -> bool:
    """Whether an info line would be dropped anyway: ``configure_logging``'s level is above info and its processors
    are still the ones in use (``capture_logs`` and any other set-up see every event). A hot path checks it to skip
    building a line nobody writes (structlog runs the processor chain up to the level check for each one)."""
    if _threshold["level"] <= logging.INFO:
        return False
    processors = structlog.get_config()["processors"]
    # capture_logs empties and refills the same list: the level check must still be its first processor
    return processors is _direct["processors"] and bool(processors) and processors[0] is _below_threshold


def log_event(logger: Any, name: str, event: str, fields: dict[str, Any]) -> None:
    """``logger.info(event, **fields)`` for a hot path (the access log: one line per request), rendered in one
    step when ``configure_logging`` set up JSON and nothing replaced it since: the line structlog's processors
    would write (context variables, fields, event, level, logger, timestamp), at half the cost. Inside an
    event loop the lines are written together at the end of the loop iteration (one ``write`` for all the
    requests that finished in it, at most ``PIPE_BUF`` bytes at a time, so lines of several workers never
    mix): a write per line was the log's largest cost. Any other set-up (console, ``capture_logs``, a level
    above info) takes structlog's path. ``name`` is ``logger``'s name. ``fields`` becomes the line: the caller
    hands it over (no copy)."""
    if (
        not _direct["json"]
        or _threshold["level"] > logging.INFO
        or structlog.get_config()["processors"] is not (_direct["processors"])
    ):
        logger.info(event, **fields)
        return
    line = fields
    line["event"] = event
    structlog.contextvars.merge_contextvars(None, "info", line)
    line["level"] = "info"
    line["logger"] = name
    line["timestamp"] = _timestamp()
    data = orjson.dumps(line, default=str)
    if _state["bytes"] + len(data) >= _CHUNK:
        _write_pending()
    _pending.append(data.decode() + "\n")
    _state["bytes"] += len(data) + 1
    scheduled = _state["loop"]
    if scheduled is not None and scheduled.is_running():
        return  # a flush is due on the running loop (only code in it runs now)
    try:
        loop = running_loop()
    except RuntimeError:  # no event loop: write now
        _write_pending()
        return
    loop.call_later(FLUSH_DELAY_SECS, _flush_pending)
    _state["loop"] = loop
