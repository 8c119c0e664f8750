"""One logging set-up for both programs: structlog key-value events, JSON in production, console in development.

Our own events (``structlog.get_logger(...)``) take structlog's native path: a bound logger, the processors
(the first drops events below the level), and one write of the rendered line; no ``logging.LogRecord``, no
handler lock, no formatter. Events of other libraries (``logging.getLogger(...)``: uvicorn, nats, aiohttp) go
through a stdlib handler that renders them with the same processors, so every line has one shape.
JSON is rendered with orjson (about a quarter of the standard library's cost per line).
"""

from __future__ import annotations

import atexit
import contextvars
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
_pending: list[tuple[dict[str, Any], str, contextvars.Context, float]] = []
"""Access-log events not yet written: (fields with the event, logger name, the context they were logged in, the
time), rendered and written together at the end of the event-loop iteration that produced them (or up to
``FLUSH_DELAY_SECS`` later), before any other line, at exit, or as soon as ``MAX_PENDING`` wait."""
_state: dict[str, Any] = {"loop": None}
"""``loop``: the event loop a flush is scheduled on (a loop closed before running it leaves the lines to the next
loop's flush or to exit)."""
_CHUNK = 4096
"""POSIX ``PIPE_BUF``: one write of at most this many bytes to a pipe is never interleaved with another
process's write (``--workers N`` share the supervisor's stderr), so no line is ever split."""
FLUSH_DELAY_SECS = 0.002
"""How long an access-log line may wait for others to share its write."""
MAX_PENDING = 64
"""How many access-log events may wait to be written (about 20 KB of lines)."""


def _flush_pending() -> None:
    _state["loop"] = None
    _write_pending()


def _write_pending(line: str = "") -> None:
    """Render the pending events and write them, then ``line``: as few writes as keep each within ``_CHUNK``
    bytes (a longer line is a write of its own)."""
    chunks: list[str] = []
    if _pending:
        taken = _pending[:]
        del _pending[: len(taken)]  # not clear(): an event another thread appends meanwhile stays for the next write
        chunk: list[bytes] = []
        size = 0
        for data in _render(taken):
            if chunk and size + len(data) > _CHUNK:
                chunks.append(b"".join(chunk).decode())
                chunk, size = [], 0
            chunk.append(data)
            size += len(data)
        chunks.append(b"".join(chunk).decode())
    if line:
        chunks.append(line)
    if chunks:
        stream: TextIO = sys.stderr
        for text in chunks:
            stream.write(text)
            stream.flush()


atexit.register(_flush_pending)


def _render(events: list[tuple[dict[str, Any], str, contextvars.Context, float]]) -> list[bytes]:
    """The JSON lines of ``events``, UTF-8: what structlog's processors would write (fields, event, the context
    variables, level, logger, timestamp), with the constant tail (level, logger) encoded once per logger name."""
    lines = []
    for line, name, context, now in events:
        _merge_context(line, context)
        if "level" in line or "logger" in line or "timestamp" in line:  # structlog overwrites them in place
            line["level"] = "info"
            line["logger"] = name
            line["timestamp"] = _timestamp(now).decode()
            lines.append(orjson.dumps(line, default=str, option=orjson.OPT_APPEND_NEWLINE))
            continue
        tail = _tails.get(name) or _tail(name)
        lines.append(orjson.dumps(line, default=str)[:-1] + tail + _timestamp(now) + b'"}\n')
    return lines


def _timestamp(now: float) -> bytes:
    """``TimeStamper(fmt="iso", utc=True)``'s value for ``now`` (with the microseconds always present), the date
    and time formatted once per second rather than once per line."""
    global _second, _prefix
    second = int(now)
    if second != _second:
        _prefix = datetime.datetime.fromtimestamp(second, _UTC).strftime("%Y-%m-%dT%H:%M:%S.").encode()
        _second = second
    return b"%s%06dZ" % (_prefix, int((now - second) * 1_000_000))


_second = -1
_prefix = b""
_CONTEXT_PREFIX = structlog.contextvars.STRUCTLOG_KEY_PREFIX
_context_keys: dict[contextvars.ContextVar[Any], str | None] = {}
"""Each context variable the access log met -> its structlog key (``None``: not one of structlog's), so the name
test of ``merge_contextvars`` runs once per variable rather than once per variable per line. The variables are the
ones the code creates (structlog makes one per key ever bound); ``_MAX_KEYS`` bounds it all the same."""
_MAX_KEYS = 256
_tails: dict[str, bytes] = {}


def _merge_context(line: dict[str, Any], context: contextvars.Context) -> None:
    """``structlog.contextvars.merge_contextvars`` (same keys, order and values) from ``context``, the snapshot
    taken when the event was logged, with each variable's name looked at once."""
    keys = _context_keys
    for var, value in context.items():
        if var in keys:
            key = keys[var]
        else:
            name = var.name
            key = name[len(_CONTEXT_PREFIX) :] if name.startswith(_CONTEXT_PREFIX) else None
            if len(keys) >= _MAX_KEYS:
                keys.clear()
            keys[var] = key
        if key is not None and value is not Ellipsis and key not in line:
            line[key] = value


def _tail(name: str) -> bytes:
    """The constant part of an access line after its fields and context, up to the timestamp's value:
    ``,"level":"info","logger":NAME,"timestamp":"``, JSON-encoded once per logger name."""
    tail = b',"level":"info","logger":' + orjson.dumps(name) + b',"timestamp":"'
    if len(_tails) < _MAX_KEYS:
        _tails[name] = tail
    return tail


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
    mix): a write per line was the log's largest cost. The call itself only keeps the fields, the time and a
    snapshot of the context: the lines are rendered together when they are written, off the request's path. Any
    other set-up (console, ``capture_logs``, a level above info) takes structlog's path. ``name`` is ``logger``'s
    name. ``fields`` becomes the line: the caller hands it over (no copy, not to be changed afterwards)."""
    if (
        not _direct["json"]
        or _threshold["level"] > logging.INFO
        or structlog.get_config()["processors"] is not (_direct["processors"])
    ):
        logger.info(event, **fields)
        return
    fields["event"] = event
    # The context is an immutable snapshot (copied in constant time): its variables are read when the line is
    # rendered, after the response has left.
    _pending.append((fields, name, contextvars.copy_context(), time.time()))
    if len(_pending) >= MAX_PENDING:
        _write_pending()
        return
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


class LazyBound:
    """``logger.bind(**fields)`` made only when a line is logged through it: a hot path binds its fields once per
    request and mostly logs nothing at a level above info (a structlog bind through the lazy proxy of
    ``structlog.get_logger`` builds a bound logger: ~4 us). ``bind`` adds fields without building one either."""

    __slots__ = ("_bound", "_fields", "_logger")

    def __init__(self, logger: Any, **fields: Any) -> None:
        self._logger = logger
        self._fields = fields
        self._bound: Any = None

    def bind(self, **fields: Any) -> LazyBound:
        return LazyBound(self._logger, **self._fields, **fields)

    def __getattr__(self, name: str) -> Any:  # info, warning, exception, ...: the bound logger's, made once
        bound = self._bound
        if bound is None:
            bound = self._bound = self._logger.bind(**self._fields)
        return getattr(bound, name)
