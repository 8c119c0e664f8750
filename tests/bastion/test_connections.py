"""Connection slots: the per-port counter behind ``service.max_connections`` and ``service.max_connections_per_ip``."""

from __future__ import annotations

from bastion._connections import REFUSAL_LOG_INTERVAL_SECS, UNCOUNTED, ConnectionSlots, Refusal


def test_the_total_cap_refuses_the_connection_after_the_last_slot() -> None:
    slots = ConnectionSlots(2)
    taken = [slots.take("10.0.0.1"), slots.take("10.0.0.2")]
    assert slots.refusal("10.0.0.3") is Refusal.MAX_CONNECTIONS
    taken[0].release()
    assert slots.refusal("10.0.0.3") is None


def test_the_per_address_cap_refuses_only_that_address() -> None:
    slots = ConnectionSlots(10, 2)
    held = [slots.take("10.0.0.9"), slots.take("10.0.0.9")]
    assert slots.refusal("10.0.0.9") is Refusal.MAX_CONNECTIONS_PER_IP
    assert slots.refusal("10.0.0.1") is None
    held[1].release()
    assert slots.refusal("10.0.0.9") is None
    held[0].release()
    assert slots.by_address == {} and slots.total == 0


def test_the_per_address_cap_is_judged_first() -> None:
    slots = ConnectionSlots(2, 2)
    slots.take("10.0.0.9")
    slots.take("10.0.0.9")
    assert slots.refusal("10.0.0.9") is Refusal.MAX_CONNECTIONS_PER_IP
    assert slots.refusal("10.0.0.1") is Refusal.MAX_CONNECTIONS


def test_zero_turns_the_per_address_cap_off() -> None:
    slots = ConnectionSlots(100, 0)
    for _ in range(50):
        slots.take("10.0.0.9")
    assert slots.refusal("10.0.0.9") is None


def test_a_connection_without_an_address_counts_in_the_total_only() -> None:
    slots = ConnectionSlots(1, 1)
    slot = slots.take(None)
    assert slots.by_address == {}
    assert slots.refusal(None) is Refusal.MAX_CONNECTIONS
    slot.release()
    assert slots.total == 0


def test_release_is_idempotent_and_the_uncounted_slot_counts_nothing() -> None:
    slots = ConnectionSlots(5, 5)
    slot = slots.take("10.0.0.1")
    slot.release()
    slot.release()
    UNCOUNTED.release()
    assert slots.total == 0 and slots.by_address == {}


def test_refusals_are_reported_at_most_once_per_interval_with_their_count() -> None:
    slots = ConnectionSlots(1, 1)
    reason = Refusal.MAX_CONNECTIONS_PER_IP
    assert slots.note_refusal(reason, 100.0) == 1  # the first one at once
    assert [slots.note_refusal(reason, 100.0 + i / 10) for i in range(1, 6)] == [0] * 5
    assert slots.note_refusal(reason, 100.0 + REFUSAL_LOG_INTERVAL_SECS) == 6  # the five quiet ones and this one
    assert slots.note_refusal(reason, 100.0 + REFUSAL_LOG_INTERVAL_SECS + 0.5) == 0


def test_each_reason_has_its_own_interval() -> None:
    slots = ConnectionSlots(1, 1)
    assert slots.note_refusal(Refusal.MAX_CONNECTIONS_PER_IP, 5.0) == 1
    assert slots.note_refusal(Refusal.MAX_CONNECTIONS, 5.1) == 1
