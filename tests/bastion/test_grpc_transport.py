"""CoalescingTransport: what one loop round writes goes out as one write, in order; close and abort."""

from __future__ import annotations

import asyncio
from typing import Any

from bastion.grpc._protocol import CoalescingTransport


class Recording(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False
        self.aborted = False

    def write(self, data: Any) -> None:
        assert not self.closed, "write after close"
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.writes.append(b"<FIN>")

    def abort(self) -> None:
        self.aborted = self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5555)}.get(name, default)


async def test_writes_of_one_round_go_out_together_in_order() -> None:
    real = Recording()
    transport = CoalescingTransport(real, asyncio.get_running_loop())
    transport.write(b"headers|")
    transport.write(b"")
    transport.write(b"data|")
    transport.write(b"trailers")
    assert real.writes == []
    await asyncio.sleep(0)
    assert real.writes == [b"headers|data|trailers"]
    transport.write(b"next")
    await asyncio.sleep(0)
    assert real.writes == [b"headers|data|trailers", b"next"]


async def test_close_writes_what_is_pending_first_and_abort_drops_it() -> None:
    real = Recording()
    transport = CoalescingTransport(real, asyncio.get_running_loop())
    transport.write(b"goaway")
    transport.close()
    assert real.writes == [b"goaway"] and real.closed
    await asyncio.sleep(0)  # the scheduled flush finds nothing to write
    assert real.writes == [b"goaway"]

    real = Recording()
    transport = CoalescingTransport(real, asyncio.get_running_loop())
    transport.write(b"lost")
    transport.abort()
    await asyncio.sleep(0)
    assert real.writes == [] and real.aborted


async def test_answer_and_close_sends_fin_and_closes_only_after_the_linger() -> None:
    real = Recording()
    transport = CoalescingTransport(real, asyncio.get_running_loop())
    transport.write(b"earlier-frames|")
    transport.answer_and_close(b"goaway")
    assert real.writes == [b"earlier-frames|", b"goaway", b"<FIN>"]
    transport.close()  # grpclib closing the connection: the linger timer does it, so a reset cannot eat the GOAWAY
    assert not real.closed


async def test_past_the_flush_size_the_writes_go_out_at_once() -> None:
    """So the socket's flow control (pause_writing) can stop a handler that answers without yielding."""
    from bastion.grpc._protocol import FLUSH_AT_BYTES

    real = Recording()
    transport = CoalescingTransport(real, asyncio.get_running_loop())
    transport.write(b"x" * (FLUSH_AT_BYTES - 1))
    assert real.writes == []
    transport.write(b"y")
    assert real.writes == [b"x" * (FLUSH_AT_BYTES - 1) + b"y"]
    await asyncio.sleep(0)
    assert len(real.writes) == 1


async def test_nothing_is_written_after_the_goaway() -> None:
    real = Recording()
    transport = CoalescingTransport(real, asyncio.get_running_loop())
    transport.answer_and_close(b"goaway")
    transport.write(b"a late answer of a call being cancelled")
    await asyncio.sleep(0)
    assert real.writes == [b"goaway", b"<FIN>"]


async def test_a_transport_closed_under_it_is_not_written_to() -> None:
    real = Recording()
    transport = CoalescingTransport(real, asyncio.get_running_loop())
    transport.write(b"late")
    real.close()  # the peer went away before the round ended
    await asyncio.sleep(0)
    assert real.writes == [] and transport.is_closing()
    assert transport.get_extra_info("peername") == ("127.0.0.1", 5555)


async def test_the_servers_connections_use_it_and_the_answer_encoder() -> None:
    from bastion.grpc._hpack import ResponseEncoder
    from bastion.grpc._interceptors import GrpcGuard
    from bastion.grpc._server import GrpcServer

    async def ready() -> bool:
        return True

    server = GrpcServer([], guard=GrpcGuard(steps=[], max_message_size=1024), ready=ready)
    protocol: Any = server.protocol_factory()
    real = Recording()
    protocol.connection_made(real)
    assert real.writes  # the server's SETTINGS went out at once, before the transport was swapped
    assert isinstance(protocol.connection._transport, CoalescingTransport)
    assert protocol.connection._transport.transport is real
    assert isinstance(protocol.connection._connection.encoder, ResponseEncoder)
    protocol.connection_lost(None)


def test_the_reset_budget_allows_a_burst_then_the_rate() -> None:
    from bastion.grpc._limits import RESET_BURST, RESETS_PER_SEC, reset_budget

    now = [100.0]
    budget = reset_budget(lambda: now[0])
    assert all(budget.take() for _ in range(RESET_BURST))
    assert not budget.take()
    now[0] += 10.5 / RESETS_PER_SEC  # time for ten and a half more
    assert [budget.take() for _ in range(11)] == [True] * 10 + [False]
    now[0] += 3600.0  # refilled, never above the burst
    assert sum(budget.take() for _ in range(RESET_BURST + 5)) == RESET_BURST


async def test_a_connection_advertises_its_stream_limit_and_releases_its_slot_when_lost() -> None:
    import struct

    from bastion._connections import ConnectionSlots
    from bastion.grpc._interceptors import GrpcGuard
    from bastion.grpc._limits import Http2Limits
    from bastion.grpc._server import GrpcServer

    async def ready() -> bool:
        return True

    limits = Http2Limits(max_concurrent_streams=7)
    server = GrpcServer([], guard=GrpcGuard(steps=[], max_message_size=1024), ready=ready, limits=limits)
    slots = ConnectionSlots(10)
    protocol: Any = server.protocol_factory()
    protocol.slot = slots.take("127.0.0.1")
    real = Recording()
    protocol.connection_made(real)
    await asyncio.sleep(0)
    written = b"".join(real.writes)
    assert b"\x04\x00\x00\x00\x00\x00" + struct.pack(">HI", 0x3, 7) in written  # SETTINGS_MAX_CONCURRENT_STREAMS
    assert slots.total == 1
    protocol.connection_lost(None)
    assert slots.total == 0
