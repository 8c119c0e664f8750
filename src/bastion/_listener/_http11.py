"""The bounded HTTP/1.1 protocol: uvicorn's httptools protocol with the listener's limits per connection."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import httptools
import structlog
from uvicorn.config import Config
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _Http11Protocol
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle
from uvicorn.server import ServerState

from bastion._compat import uvicorn as uvicorn_compat
from bastion._connections import UNCOUNTED, Slot
from bastion._listener._answers import HEADERS_TOO_LARGE_RESPONSE, answer_and_close, raw_response
from bastion._listener._config import identity_of, limits_of
from bastion._listener._cycle import CoalescingCycle
from bastion._listener._flow import ReadGate
from bastion._listener._framing import framing_error
from bastion._listener._websocket import WebSocketProtocol
from bastion._tls import ClientCertificate, connection_certificate
from bastion.errors import BadRequest, BastionError, HeadersTooLarge
from bastion.types import SCOPE_CLIENT_CERTIFICATE

log = structlog.get_logger("bastion.server")

# The parser reports the request target and each header's name and value; the rest of a head is counted as
# sent in canonical form: "<method> <target> HTTP/1.1\r\n", "<name>: <value>\r\n" per header, a final "\r\n".
REQUEST_LINE_FRAMING = len(b"  HTTP/1.1\r\n") + len(b"\r\n")
HEADER_LINE_FRAMING = len(b": \r\n")
# Longer than any method llhttp accepts: below this margin under the limit the method cannot matter.
METHOD_MARGIN = 32
PARSE_SLICE_BYTES = 1024
"""Held input is parsed a slice at a time (plus the rest of a body of known length, which cannot hide a request),
checking the pipelined-request queue between slices. httptools cannot stop inside a buffer and say where: a
callback that raises stops the parser, but the position is lost (only an upgrade reports it)."""
WHOLE_READ_BYTES = 2048
"""A read this short, with nothing queued, is parsed whole (every ordinary request's path). So the queue can pass
``service.max_pipelined_requests`` by the requests of one such read or slice: at most 82 of the smallest (25
bytes)."""
SINGLE_HEAD_READ_BYTES = 4096
"""A longer read up to this, with nothing queued and at most one complete head in it (a request with large headers
or a small body), is parsed whole too: counting its heads costs less than slicing it."""
NOTED_HEADERS = frozenset({b"host", b"transfer-encoding", b"content-length", b"expect"})
EMPTY = memoryview(b"")


class BoundedHttpProtocol(_Http11Protocol):
    """uvicorn's HTTP/1.1 (httptools) protocol, bounding what one connection makes the process hold.

    - Head over ``max_header_bytes`` or more than ``max_headers`` headers: ``431`` in the error shape and
      close (after the responses to earlier pipelined requests). While a head is unfinished, the bytes
      received count against the limit: httptools holds an unfinished header value until its line ends, so
      the per-header callback alone would let one endless header grow without bound.
    - Head not complete ``header_read_timeout_secs`` after its first byte (after the accept, for the
      connection's first request): the connection is closed without a response, like nginx and Go do; a
      ``408`` would race with a client that starts its next request at that moment.
    - Pipelined requests: at most ``max_pipelined_requests`` parsed ahead of the one being answered (plus one
      read's or slice's worth, see ``WHOLE_READ_BYTES``); past it, the rest of the input is held unparsed and the
      transport stops reading until the queue drains. uvicorn alone parses every read whole and queues all of
      it. Parsing also waits while the request being read has more body than uvicorn's high-water mark.
    - Framing that RFC 9112 forbids and llhttp lets through (``_framing``): ``400`` or ``501`` and close;
      an unparseable request: ``400`` in the error shape and close (uvicorn answers in plain text).

    Per request this costs a few integer updates; the only timer a request allocates is for a head that
    arrives in more than one read. The connection's :class:`Slot` is released when it is lost, or handed to
    the WebSocket protocol at an upgrade.
    """

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        connected_at: float | None = None,
        slot: Slot = UNCOUNTED,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        limits = limits_of(config)
        self.max_header_bytes = limits.max_header_bytes
        self.max_headers = limits.max_headers
        self.header_read_timeout = limits.header_read_timeout_secs
        self.max_pipelined = limits.max_pipelined_requests
        self.identity_from = identity_of(config)
        self.client_certificate: ClientCertificate | None = None
        self.connected_at = connected_at
        self.slot = slot
        # The header read deadline, or after a refusal the linger; never both.
        self.timer: asyncio.TimerHandle | None = None
        # From a request's end (or the accept) to the end of the next head: bytes received belong to a head.
        self.awaiting_head = True
        # Bytes received for the unfinished head, counted per parse (a head that starts inside a read is counted
        # from the next one on: under by at most one read, never over).
        self.wire_head_bytes = 0
        # The current head as parsed so far: header names, values and their framing.
        self.parsed_head_bytes = 0
        self.host_headers = 0
        self.transfer_encoding: bytes | None = None
        # The request whose body is being parsed: its declared length (None: none, or chunked) and body so far.
        self.body_length: int | None = None
        self.body_parsed = 0
        # Input received but not parsed yet (the queue was full), from ``held_at`` on; a call to parse it.
        self.held = EMPTY
        self.held_at = 0
        self.parse_call: asyncio.Handle | None = None
        # The request being answered (uvicorn's ``cycle`` is the last one parsed, perhaps queued behind it).
        self.answering: RequestResponseCycle | None = None
        self.head_refused = False
        self.refusal = HEADERS_TOO_LARGE_RESPONSE
        self.gate: ReadGate

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.identity_from is not None:  # mutual TLS: read once per connection, put in each request's scope
            self.client_certificate = connection_certificate(transport.get_extra_info("ssl_object"), self.identity_from)
        self.flow = self.gate = ReadGate(transport, self._parse_held_soon)
        started = self.connected_at if self.connected_at is not None else self.loop.time()
        self.timer = self.loop.call_at(started + self.header_read_timeout, self._header_read_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self.slot.release()
        self._cancel_timer()
        self._drop_held()
        answering = self.answering
        if answering is not None and answering is not self.cycle and not answering.response_complete:
            # uvicorn tells only the last request parsed: a response still being written (to a client that
            # pipelined and left) would write to the closed transport and fail with a traceback.
            answering.disconnected = True
            answering.message_event.set()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        # uvicorn's data_received, with the head bounds around the parser and the pipelined queue bounded.
        if self.head_refused:
            return  # answered (or about to be): the parser must not buffer any more of the refused head
        uvicorn_compat.unset_keepalive(self)
        if self.held:  # a TLS transport may deliver what it had decrypted before the pause
            self.held = memoryview(bytes(self.held[self.held_at :]) + data)
            self.held_at = 0
            self._parse_held()
        elif (
            not self.pipeline
            and (
                len(data) <= WHOLE_READ_BYTES or (len(data) <= SINGLE_HEAD_READ_BYTES and data.count(b"\r\n\r\n") <= 1)
            )
            and not self._body_backlogged()
        ):  # every request's path: nothing queued, and a read that cannot queue much (else _parse_held decides)
            self._parse(data)
        else:
            self.held, self.held_at = memoryview(data), 0
            self._parse_held()

    def _may_parse(self) -> bool:
        return len(self.pipeline) < self.max_pipelined and not self._body_backlogged()

    def _body_backlogged(self) -> bool:
        """Whether the request being read has more body waiting for the app than uvicorn's high-water mark.

        Only while its response is unfinished: an app that answered without reading the body never will, and
        what it left stays in the finished cycle until the next request replaces it (uvicorn resumes reading at
        the response's end whatever is left).
        """
        cycle = self.cycle
        return cycle is not None and not cycle.response_complete and len(cycle.body) > HIGH_WATER_LIMIT

    def _parse_held(self) -> None:
        """Parse the held input a slice at a time while the queue has room; hold the rest."""
        self.parse_call = None
        uvicorn_compat.unset_keepalive(self)  # uvicorn armed it if the queue ran empty: the next request is here
        held = self.held
        while self.held_at < len(held):
            if self.head_refused or self.transport.is_closing():
                break
            if not self._may_parse():
                self._hold()
                return
            size = PARSE_SLICE_BYTES
            if self.body_length is not None:
                size += self.body_length - self.body_parsed  # the rest of this body: no request hides in it
            piece = held[self.held_at : self.held_at + size]
            self.held_at += len(piece)
            if not self._parse(piece):
                break
        self._drop_held()
        self.gate.release()

    def _parse_held_soon(self) -> None:
        # From uvicorn's resume (inside a response's send, or the app's receive): parse on the next loop turn.
        if self.parse_call is None and self.held:
            self.parse_call = self.loop.call_soon(self._parse_held)

    def _hold(self) -> None:
        self.gate.hold()
        if self.timer is not None and not self.head_refused:
            # The next head waits for the queue, not for the client: its deadline restarts with its next slice.
            self._cancel_timer()

    def _drop_held(self) -> None:
        self.held, self.held_at = EMPTY, 0
        if self.parse_call is not None:
            self.parse_call.cancel()
            self.parse_call = None

    def _parse(self, data: bytes | memoryview) -> bool:
        """Feed ``data`` to the parser; ``False`` when the connection stops being HTTP/1.1 requests (refused,
        upgraded)."""
        if self.awaiting_head:
            self.wire_head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if uvicorn_compat.should_upgrade(self):
                self.handle_websocket_upgrade()
            else:
                uvicorn_compat.warn_unsupported_upgrade(self)
            return False
        except httptools.HttpParserError as exc:
            cause = exc.__context__
            if isinstance(cause, HeadersTooLarge):
                self._refuse_head_too_large()
            elif isinstance(cause, BastionError):
                self._refuse(cause, cause.detail)
            else:
                self._refuse(BadRequest("Invalid HTTP request"), str(exc))
            return False
        if self.awaiting_head and self.wire_head_bytes:
            # Still unfinished after the whole piece: every byte of it belonged to the head.
            if self.wire_head_bytes > self.max_header_bytes:
                self._refuse_head_too_large()
                return False
            if self.timer is None:
                self.timer = self.loop.call_later(self.header_read_timeout, self._header_read_timeout)
        return True

    def on_header(self, name: bytes, value: bytes) -> None:
        self.parsed_head_bytes += len(name) + len(value) + HEADER_LINE_FRAMING
        headers = self.headers
        if len(headers) >= self.max_headers or self.parsed_head_bytes > self.max_header_bytes:
            raise HeadersTooLarge  # stops the parser; _parse answers
        # uvicorn's on_header, inlined (it runs for every header line), with the framing headers noted.
        name = name.lower()
        headers.append((name, value))
        if name in NOTED_HEADERS:
            if name == b"host":
                self.host_headers += 1
            elif name == b"content-length":
                self.body_length = int(value)  # llhttp has checked it (digits, one value); a ValueError is a 400
            elif name == b"transfer-encoding":
                self.transfer_encoding = (
                    value if self.transfer_encoding is None else self.transfer_encoding + b"," + value
                )
            elif value.lower() == b"100-continue":  # expect
                self.expect_100_continue = True

    def on_headers_complete(self) -> None:
        size = self.parsed_head_bytes + len(self.url) + REQUEST_LINE_FRAMING
        if (
            size > self.max_header_bytes - METHOD_MARGIN
            and size + len(self.parser.get_method()) > self.max_header_bytes
        ):
            raise HeadersTooLarge
        if self.host_headers != 1 or self.transfer_encoding is not None:
            error = framing_error(self.parser.get_http_version(), self.host_headers, self.transfer_encoding)
            if error is not None:
                raise error  # stops the parser; _parse answers
            self.transfer_encoding = None
        self.host_headers = 0
        self._cancel_timer()
        self.awaiting_head = False
        self.wire_head_bytes = self.parsed_head_bytes = 0
        idle = self.cycle is None or self.cycle.response_complete
        if self.identity_from is not None:
            cast("dict[str, Any]", self.scope)[SCOPE_CLIENT_CERTIFICATE] = self.client_certificate
        super().on_headers_complete()
        cycle = self.cycle
        if idle:
            self.answering = cycle
        if type(cycle) is RequestResponseCycle:
            uvicorn_compat.adopt_cycle(cycle, CoalescingCycle)  # before its task first runs: its send is ours

    def on_body(self, body: bytes) -> None:
        self.body_parsed += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self.awaiting_head = True
        self.body_length = None
        self.body_parsed = 0

    def on_response_complete(self) -> None:
        # Answered before the request's body had all arrived (a 401, 404, 413 or 429 refuses before reading it, a
        # 408 because it did not come): the rest is not worth waiting for, and a client trickling it would hold the
        # connection for as long as it likes. Closed like a refused head: FIN, then what arrives is dropped.
        # self.cycle is the last request parsed: with a pipelined request queued behind this response it is that
        # one (its response not started), whose body may simply not have been read yet.
        # A response that started before its request's body had all arrived said ``connection: close``
        # (CoalescingCycle): the connection ends after it even if the body has arrived since, and requests pipelined
        # behind it are not answered.
        cycle = self.cycle
        unfinished = cycle is not None and cycle.response_complete and cycle.more_body
        unfinished = (unfinished or getattr(self.answering, "closes_early", False)) and not self.head_refused
        if unfinished:
            self.pipeline.clear()
        following = self.pipeline[-1][0] if self.pipeline else None
        super().on_response_complete()  # resumes reading (held input first: ReadGate), starts the next request
        if self.transport.is_closing():
            return
        self.answering = following
        if self.head_refused and self.cycle.response_complete:
            self.timer = answer_and_close(self.transport, self.refusal, self.loop)
        elif unfinished:
            self.head_refused = True  # drop the rest of the body
            self._drop_held()
            self.gate.release()
            if self.timeout_keep_alive_task is not None:
                self.timeout_keep_alive_task.cancel()
                self.timeout_keep_alive_task = None
            self._cancel_timer()
            self.timer = answer_and_close(self.transport, b"", self.loop)

    def handle_websocket_upgrade(self) -> None:
        super().handle_websocket_upgrade()
        protocol = self.transport.get_protocol()
        slot, self.slot = self.slot, UNCOUNTED
        if isinstance(protocol, WebSocketProtocol):
            protocol.slot = slot  # the connection is the WebSocket's now: it releases the slot when lost
            protocol.mutual_tls = self.identity_from is not None
            protocol.client_certificate = self.client_certificate
        else:
            slot.release()

    def _refuse_head_too_large(self) -> None:
        log.info(
            "http_headers_too_large",
            client=self.client[0] if self.client else None,
            max_header_bytes=self.max_header_bytes,
            max_headers=self.max_headers,
        )
        self._answer_refusal(HEADERS_TOO_LARGE_RESPONSE)

    def _refuse(self, error: BastionError, reason: str) -> None:
        log.info(
            "http_invalid_request",
            client=self.client[0] if self.client else None,
            status=error.status,
            reason=reason,
        )
        self._answer_refusal(raw_response(error))

    def _answer_refusal(self, response: bytes) -> None:
        self.head_refused = True
        self.awaiting_head = False
        self.refusal = response
        self._cancel_timer()
        self._drop_held()
        self.gate.release()  # what still arrives is read and dropped (data_received), not left to reset the close
        if self.cycle is None or self.cycle.response_complete:
            self.timer = answer_and_close(self.transport, response, self.loop)
        else:
            # An earlier pipelined request is still being answered: the refusal follows the last of its responses
            # (on_response_complete); what arrives meanwhile is dropped.
            self.flow.pause_reading()

    def _header_read_timeout(self) -> None:
        self.timer = None
        log.info("http_header_read_timeout", client=self.client[0] if self.client else None)
        if self.cycle is None or self.cycle.response_complete:
            self.transport.close()
        else:
            # The late head is pipelined behind a response still being written: close once it is done.
            self.cycle.keep_alive = False

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
