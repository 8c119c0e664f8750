"""One SMTP connection: aiosmtpd's protocol subclassed for the spec's exact replies.

aiosmtpd keeps the transport plumbing (stream reader, idle timer, STARTTLS transport switch), reached through
``_compat.SmtpTransport``;
the command loop, every command handler and the DATA phase are ours, because their reply texts
and several behaviours differ from the spec (a second STARTTLS breaks stock aiosmtpd's connection).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from typing import cast

import structlog

from mailrelay.smtp import _replies as r
from mailrelay.smtp._compat import SmtpTransport
from mailrelay.smtp._data import DOT_STUFFED_LINE_OCTETS, read_message
from mailrelay.smtp._hub import ConnectionHub
from mailrelay.smtp._paths import check_mail_parameters, parse_path, printable_domain, strip_keyword
from mailrelay.smtp._replies import Reply
from mailrelay.smtp._session import (
    ALLOWED_STATES,
    Envelope,
    EnvelopeHandler,
    Event,
    SenderPolicy,
    Session,
    SmtpObserver,
    SmtpOptions,
    SmtpState,
)

COMMAND_LINE_LIMIT = 512  # RFC 5321 4.5.3.1.4, verb and CRLF included
MAIL_PARAMETER_ALLOWANCE = 64  # RFC 1870 SIZE=, RFC 6152 BODY=, RFC 6531 SMTPUTF8 extend MAIL's line
TEXT_LINE_LIMIT = DOT_STUFFED_LINE_OCTETS  # the reader's limit: a line's octets before its CRLF (RFC 5321 4.5.3.1.6)
MAX_BAD_COMMANDS = 10  # unrecognized or malformed commands before the connection is dropped
MAX_RECIPIENTS = 100  # accepted recipients per transaction (RFC 5321 4.5.3.1.8's minimum); more get 452
log = structlog.get_logger("mailrelay.smtp")


class RelaySMTP(SmtpTransport):
    """One SMTP connection. Replies come from `mailrelay.smtp._replies`; each command is a small
    method in `self._commands`; state changes go through `Session.apply` (the state table)."""

    def __init__(
        self,
        *,
        options: SmtpOptions,
        handler: EnvelopeHandler,
        hub: ConnectionHub,
        tls_context: ssl.SSLContext | None,
        sender_policy: SenderPolicy | None = None,
        observer: SmtpObserver | None = None,
    ) -> None:
        self.options = options
        self.hub = hub
        self.envelope_handler = handler
        self.sender_policy = sender_policy
        self.observer = observer
        self.relay_session = Session(peer_ip="")
        self._admitted = False
        self._lost = False
        self._delivering = False
        self._last_activity = 0.0
        super().__init__(
            None,
            data_size_limit=options.max_message_size,
            enable_SMTPUTF8=True,
            decode_data=False,
            hostname=r.SERVER_NAME,
            ident="SMTP Server Ready",
            tls_context=tls_context,
            timeout=options.idle_timeout,
            loop=asyncio.get_running_loop(),
        )
        self._commands: dict[str, Callable[[str | None], Awaitable[None]]] = {
            "EHLO": self._ehlo,
            "HELO": self._helo,
            "STARTTLS": self._starttls,
            "MAIL": self._mail,
            "RCPT": self._rcpt,
            "DATA": self._data,
            "RSET": self._rset,
            "NOOP": self._noop,
            "QUIT": self._quit,
            "VRFY": self._vrfy,
            "HELP": self._help,
            "EXPN": self._not_implemented,
        }

    line_length_limit = TEXT_LINE_LIMIT

    @property
    def busy(self) -> bool:
        """Inside DATA or waiting for the webhook: a session that shutdown lets finish."""
        return self._delivering or self.relay_session.state is SmtpState.DATA

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        tls_switch = self.plain_transport is not None and self.transport is not None
        super().connection_made(transport)
        if tls_switch:
            # RFC 3207 4.2: forget everything learnt before TLS; the client must EHLO again
            self.relay_session.tls = True
            self.relay_session.helo = None
            self.relay_session.extended = False
            self.relay_session.new_envelope()
            self.relay_session.apply(Event.TLS_STARTED)
            return
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            self.relay_session = Session(peer_ip=str(peer[0]), peer_port=int(peer[1]))
        else:
            self.relay_session = Session(peer_ip="unknown")

    def eof_received(self) -> bool:
        """The client closed its sending side. Stock aiosmtpd cancels the session here, which drops
        the replies to commands already received (even the 250 of a message it goes on to deliver);
        instead the reader sees EOF after the buffered commands, and they are all answered."""
        self.reader.feed_eof()
        # a plain transport stays open so the replies can be written; TLS cannot half-close
        return not self.tls_active

    def connection_lost(self, error: Exception | None) -> None:
        if self._lost:
            return
        self._lost = True
        if self._admitted:
            self.hub.release(self, self.relay_session.peer_ip)
        super().connection_lost(error)

    def close_with(self, reply: Reply) -> None:
        """Send a final reply (421 ...) and close, from outside the command loop."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        cast(asyncio.WriteTransport, transport).write(reply.line())  # uvloop's are no asyncio.WriteTransport
        self._close()

    def _touch(self) -> None:
        self._last_activity = self.loop.time()

    def on_idle_timeout(self) -> None:
        """The timer set when the connection was made (or re-armed here) fired: time out if nothing came for
        `idle_timeout` (a command, or a line of DATA), else wait for the rest. Commands only note their time
        (`_touch`): re-arming a loop timer on each one cost a cancel and a new timer per command."""
        if self._delivering:  # the client is waiting for us, not idle
            self.restart_idle_timer()
            return
        remaining = self._last_activity + self.idle_timeout - self.loop.time()
        if remaining > 0:
            self.restart_idle_timer(remaining)
            return
        log.info("smtp_idle_timeout", peer=self.relay_session.peer_ip)
        self.close_with(r.IDLE_TIMEOUT)

    async def _push(self, reply: Reply) -> None:
        self.writer.write(reply.line())  # what aiosmtpd's push(str(reply)) writes, without its debug log call
        await self.writer.drain()

    async def _push_lines(self, lines: list[str]) -> None:
        self.writer.write("".join(f"{line}\r\n" for line in lines).encode("utf-8"))
        await self.writer.drain()

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        plain = self.plain_transport
        if plain is not None:
            # A TLS close waits (30 s) for a close_notify a hostile client never sends: the reply is queued on the
            # socket below, so close it too and the session (and its per-IP slot) ends now.
            plain.close()

    async def serve_commands(self) -> None:
        session = self.relay_session
        refusal = self.hub.admit(self, session.peer_ip)
        if refusal is not None:
            log.warning("smtp_too_many_connections", peer=session.peer_ip, reply=refusal.code)
            if self.observer is not None:
                self.observer.session_refused(refusal)
            self.close_with(refusal)
            return
        self._admitted = True
        if self.hub.shutting_down:
            self.close_with(r.SHUTTING_DOWN)
            return
        log.debug("smtp_connected", peer=session.peer_ip)
        try:
            await self._push(r.GREETING)
            while self.transport is not None and not self.transport.is_closing():
                line = await self._read_command_line()
                if line is None:
                    await self._bad_command(r.COMMAND_TOO_LONG)
                    continue
                try:
                    await self._run_command(line)
                except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
                    raise
                except Exception:  # a bug must cost one command, not the session or the process
                    log.exception("smtp_command_failed", peer=session.peer_ip)
                    await self._push(r.LOCAL_ERROR)
        except (ConnectionError, asyncio.IncompleteReadError):
            log.debug("smtp_connection_dropped", peer=session.peer_ip)
            self._close()
        except asyncio.CancelledError:
            self._close()
            raise

    async def _read_command_line(self) -> bytes | None:
        """One command line without its line ending; None when it was longer than the stream limit."""
        try:
            line = await self.reader.readuntil()
        except asyncio.LimitOverrunError as exc:
            await self.reader.read(exc.consumed)
            while True:  # discard the rest of the over-long line
                try:
                    await self.reader.readuntil()
                    return None
                except asyncio.LimitOverrunError as more:
                    await self.reader.read(more.consumed)
        return line.rstrip(b"\r\n")

    async def _run_command(self, line: bytes) -> None:
        verb_bytes, _, arg_bytes = line.partition(b" ")
        try:
            verb = verb_bytes.decode("ascii").upper()
        except UnicodeDecodeError:
            await self._bad_command(r.UNRECOGNIZED_COMMAND)
            return
        limit = COMMAND_LINE_LIMIT + (MAIL_PARAMETER_ALLOWANCE if verb in ("MAIL", "RCPT") else 0)
        if len(line) + 2 > limit:
            await self._bad_command(r.COMMAND_TOO_LONG)
            return
        command = self._commands.get(verb)
        if command is None or not verb:
            await self._bad_command(r.UNRECOGNIZED_COMMAND)
            return
        arg_bytes = arg_bytes.strip()
        arg = arg_bytes.decode("utf-8", "surrogateescape") if arg_bytes else None
        self._touch()
        allowed = ALLOWED_STATES.get(verb)
        if verb != "STARTTLS" and allowed is not None and self.relay_session.state not in allowed:
            await self._push(r.BAD_SEQUENCE)
            return
        await command(arg)

    async def _bad_command(self, reply: Reply) -> None:
        self.relay_session.bad_commands += 1
        if self.relay_session.bad_commands > MAX_BAD_COMMANDS:
            log.warning("smtp_too_many_bad_commands", peer=self.relay_session.peer_ip)
            self.close_with(r.TOO_MANY_BAD_COMMANDS)
            return
        await self._push(reply)

    async def _ehlo(self, arg: str | None) -> None:
        session = self.relay_session
        domain = printable_domain(arg)
        session.helo = domain
        session.extended = True
        session.new_envelope()
        session.apply(Event.HELLO)
        offer_tls = self.tls_context is not None and not self.tls_active
        await self._push_lines(
            r.ehlo_lines(domain=domain, size_limit=self.options.max_message_size, offer_starttls=offer_tls)
        )

    async def _helo(self, arg: str | None) -> None:
        session = self.relay_session
        session.helo = printable_domain(arg)
        session.extended = False
        session.new_envelope()
        session.apply(Event.HELLO)
        await self._push(r.HELO_OK)

    async def _starttls(self, arg: str | None) -> None:
        # "TLS already active" wins over the state check: the spec's row applies in any state
        if self.tls_active:
            await self._push(r.STARTTLS_ALREADY_ACTIVE)
            return
        if self.relay_session.state is not SmtpState.GREETED:
            await self._push(r.BAD_SEQUENCE)
            return
        if arg:
            await self._push(r.SYNTAX_ERROR)
            return
        if self.tls_context is None:
            await self._push(r.TLS_NOT_AVAILABLE)
            return
        await self._push(r.STARTTLS_GO_AHEAD)
        # connection_made() runs again once the handshake is done
        waiter = self.start_tls(self.tls_context)
        try:
            await waiter
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.info("smtp_tls_handshake_failed", peer=self.relay_session.peer_ip, error=type(exc).__name__)
            plain = self.plain_transport
            assert plain is not None
            plain.close()
            self.connection_lost(exc)

    async def _mail(self, arg: str | None) -> None:
        session = self.relay_session
        path = strip_keyword("FROM:", arg)
        if path is None or not path.strip():
            await self._push(r.MAIL_FROM_SYNTAX)
            return
        address, rest = parse_path(path)
        if address is None or not address:
            await self._push(r.MAIL_FROM_SYNTAX)
            return
        if address == "<>":
            address = ""  # the null reverse-path of bounces (RFC 5321 4.5.5) is accepted
        options = (rest or "").upper().split()
        if options and not session.extended:
            await self._push(r.MAIL_FROM_SYNTAX)
            return
        problem = check_mail_parameters(options, max_message_size=self.options.max_message_size)
        if problem is not None:
            await self._push(problem)
            return
        if self.sender_policy is not None:
            refusal = await self.sender_policy.check_sender(
                peer_ip=session.peer_ip, helo=session.helo or "", mail_from=address, tls=session.tls
            )
            if refusal is not None:
                await self._push(refusal)
                return
        session.envelope.mail_from = address
        session.envelope.mail_options = options
        session.envelope.smtp_utf8 = "SMTPUTF8" in options
        session.apply(Event.SENDER_ACCEPTED)
        await self._push(r.OK)

    async def _rcpt(self, arg: str | None) -> None:
        session = self.relay_session
        path = strip_keyword("TO:", arg)
        address, rest = parse_path(path) if path is not None and path.strip() else ("", None)
        if not address or address == "<>":
            await self._push(r.RCPT_TO_SYNTAX)
            return
        if rest and rest.strip():
            await self._push(r.PARAMETERS_NOT_IMPLEMENTED if session.extended else r.RCPT_TO_SYNTAX)
            return
        assert self.options.router is not None  # set by SmtpOptions.__post_init__
        route = self.options.router.route_for(address)
        if route is not None:
            envelope = session.envelope
            if envelope.route is not None and route is not envelope.route:
                # one webhook per transaction: the client sends this recipient again in a new one (RFC 5321 4.5.3.1.10)
                await self._answer_recipient(r.OTHER_ROUTE)
                return
            if address.lower() not in (a.lower() for a in envelope.recipients):
                if len(envelope.recipients) >= MAX_RECIPIENTS:  # the sender sends the rest in another transaction
                    await self._answer_recipient(r.TOO_MANY_RECIPIENTS)
                    return
                envelope.recipients.append(address)
            envelope.route = route
            session.apply(Event.RECIPIENT_ACCEPTED)
            await self._answer_recipient(r.OK)
            return
        session.unknown_recipients += 1
        if session.unknown_recipients > self.options.max_unknown_recipients:
            log.warning("smtp_too_many_unknown_recipients", peer=session.peer_ip)
            if self.observer is not None:
                self.observer.recipient_answered(r.TOO_MANY_UNKNOWN_RCPTS)
            self.close_with(r.TOO_MANY_UNKNOWN_RCPTS)
            return
        session.envelope.recipients.clear()
        session.envelope.route = None
        session.apply(Event.RECIPIENT_UNKNOWN)
        await self._answer_recipient(r.NO_SUCH_USER)

    async def _answer_recipient(self, reply: Reply) -> None:
        if self.observer is not None:
            self.observer.recipient_answered(reply)
        await self._push(reply)

    async def _data(self, arg: str | None) -> None:
        session = self.relay_session
        if arg:
            await self._push(r.SYNTAX_ERROR)
            return
        session.apply(Event.DATA_STARTED)
        await self._push(r.START_MAIL_INPUT)
        content = await read_message(self.reader, max_size=self.options.max_message_size, on_line=self._touch)
        envelope = session.envelope
        session.new_envelope()
        if isinstance(content, Reply):
            session.apply(Event.DATA_FINISHED)
            if self.observer is not None:
                self.observer.message_answered(content)
            await self._push(content)
            return
        envelope.content = content
        session.messages += 1
        reply = await self._deliver(envelope)
        session.apply(Event.DATA_FINISHED)
        await self._push(reply)
        if self.hub.shutting_down:
            self.close_with(r.SHUTTING_DOWN)

    async def _deliver(self, envelope: Envelope) -> Reply:
        self._delivering = True
        # Shielded: a client that hangs up after the final dot does not cut a POST in half.
        task = self.loop.create_task(self._handle_envelope(envelope))  # ensure_future would call getpid()
        self.hub.track(task)
        try:
            return await asyncio.shield(task)
        finally:
            self._delivering = False

    async def _handle_envelope(self, envelope: Envelope) -> Reply:
        """The handler's reply, told to the observer here, inside the shielded task: a client that hangs up after
        the final dot does not hear it, but its message was delivered all the same."""
        try:
            reply = await self.envelope_handler.handle_envelope(envelope, self.relay_session)
        except Exception:
            log.exception("message_handler_failed", peer=self.relay_session.peer_ip)
            reply = r.LOCAL_ERROR
        if self.observer is not None:
            self.observer.message_answered(reply)
        return reply

    async def _rset(self, arg: str | None) -> None:
        if arg:
            await self._push(r.SYNTAX_ERROR)
            return
        self.relay_session.new_envelope()
        self.relay_session.apply(Event.RESET)
        await self._push(r.OK)

    async def _noop(self, arg: str | None) -> None:
        await self._push(r.OK)  # RFC 5321 4.1.1.9: a parameter is ignored

    async def _quit(self, arg: str | None) -> None:
        await self._push(r.BYE)
        self._close()

    async def _vrfy(self, arg: str | None) -> None:
        await self._push(r.CANNOT_VRFY if arg else r.SYNTAX_ERROR)

    async def _help(self, arg: str | None) -> None:
        await self._push(r.HELP)

    async def _not_implemented(self, arg: str | None) -> None:
        await self._push(r.NOT_IMPLEMENTED)
