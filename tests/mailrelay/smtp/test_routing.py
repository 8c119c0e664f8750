"""RCPT TO against the router in-process: every pattern form, the stripped tag, one route per transaction."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from mailrelay._routing import Route, Router, parse_pattern
from mailrelay.smtp import _replies as r
from mailrelay.smtp._server import SmtpServer
from tests.mailrelay.smtp.support import Client, Connect, ScriptedHandler

MakeServer = Callable[..., Awaitable[tuple[SmtpServer, Connect]]]


def router(*, strip_tag: bool = False) -> Router:
    def route(name: str, *patterns: str) -> Route:
        parsed = tuple(parse_pattern(p, strip_tag=strip_tag) for p in patterns)
        return Route(name=name, patterns=parsed, webhook_url="")

    return Router(
        [route("default", "inbox@example.test", "*@corp.test"), route("support", "help+*@example.test")],
        strip_tag=strip_tag,
    )


async def greeted(connect: Connect) -> Client:
    client = await connect()
    await client.reply()
    await client.command("EHLO tester")
    assert await client.command("MAIL FROM:<a@example.org>") == [b"250 OK"]
    return client


async def test_wildcard_and_plus_forms_are_accepted(make_server: MakeServer) -> None:
    _, connect = await make_server(router=router())
    client = await greeted(connect)
    assert await client.command("RCPT TO:<Anyone@CORP.test>") == [b"250 OK"]
    assert await client.command("RCPT TO:<inbox+x@example.test>") == [str(r.NO_SUCH_USER).encode()]


async def test_stripped_tag_matches_the_exact_address(make_server: MakeServer, handler: ScriptedHandler) -> None:
    _, connect = await make_server(router=router(strip_tag=True))
    client = await greeted(connect)
    assert await client.command("RCPT TO:<inbox+news@example.test>") == [b"250 OK"]
    assert await client.command("DATA") == [str(r.START_MAIL_INPUT).encode()]
    assert await client.command("Subject: x\r\n\r\nhi\r\n.") == [str(r.MESSAGE_ACCEPTED).encode()]
    (envelope,) = handler.envelopes
    assert (envelope.recipients, envelope.route and envelope.route.name) == (["inbox+news@example.test"], "default")


async def test_recipient_of_another_route_gets_452_and_is_not_added(
    make_server: MakeServer, handler: ScriptedHandler
) -> None:
    _, connect = await make_server(router=router())
    client = await greeted(connect)
    assert await client.command("RCPT TO:<help+a@example.test>") == [b"250 OK"]
    assert await client.command("RCPT TO:<inbox@example.test>") == [str(r.OTHER_ROUTE).encode()]
    assert await client.command("RCPT TO:<help@example.test>") == [b"250 OK"]
    assert await client.command("DATA") == [str(r.START_MAIL_INPUT).encode()]
    assert await client.command("Subject: x\r\n\r\nhi\r\n.") == [str(r.MESSAGE_ACCEPTED).encode()]
    (envelope,) = handler.envelopes
    assert envelope.recipients == ["help+a@example.test", "help@example.test"]
    assert envelope.route is not None and envelope.route.name == "support"


async def test_unknown_recipient_clears_the_route_too(make_server: MakeServer) -> None:
    """After a 550 the accepted recipients are cleared (the spec), and with them the transaction's route."""
    _, connect = await make_server(router=router())
    client = await greeted(connect)
    assert await client.command("RCPT TO:<help@example.test>") == [b"250 OK"]
    assert await client.command("RCPT TO:<nobody@example.test>") == [str(r.NO_SUCH_USER).encode()]
    assert await client.command("RCPT TO:<inbox@example.test>") == [b"250 OK"]


async def test_a_transaction_takes_at_most_100_recipients(make_server: MakeServer, handler: ScriptedHandler) -> None:
    """With `*@domain` every address is accepted: the 101st distinct one gets 452 (RFC 5321 4.5.3.1.10), so a
    client cannot grow a transaction (and its payload's `recipients`) without bound."""
    _, connect = await make_server(router=router())
    client = await greeted(connect)
    for n in range(100):
        assert await client.command(f"RCPT TO:<user{n}@corp.test>") == [b"250 OK"]
    assert await client.command("RCPT TO:<user100@corp.test>") == [str(r.TOO_MANY_RECIPIENTS).encode()]
    assert await client.command("RCPT TO:<USER7@corp.test>") == [b"250 OK"]  # one already in: still accepted
    assert await client.command("DATA") == [str(r.START_MAIL_INPUT).encode()]
    assert await client.command("Subject: x\r\n\r\nhi\r\n.") == [str(r.MESSAGE_ACCEPTED).encode()]
    (envelope,) = handler.envelopes
    assert len(envelope.recipients) == 100
