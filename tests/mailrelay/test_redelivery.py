"""Queue mode's decision after one delivery: ack, redeliver after a wait, or dead-letter with the last error."""

from __future__ import annotations

import pytest

from mailrelay._delivery import Attempt, outcome_of
from mailrelay._redelivery import Action, Decision, RedeliveryRules, decide
from mailrelay._target import Outcome, Verdict

RULES = RedeliveryRules(max_attempts=5, max_age=3600, backoff_base=2.0, backoff_cap=300)
NOW = 1_700_000_000.0


def decided(attempt: Attempt, *, number: int = 1, age: float = 10.0, circuit_wait: float = 0.0) -> Decision:
    """The decision after a POST answered as `attempt`, judged by the webhook target as the workers get it."""
    outcome = outcome_of(attempt, now=NOW)
    return decide(outcome, number=number, age=age, rules=RULES, circuit_wait=circuit_wait, random=lambda: 1.0)


def test_2xx_is_acked() -> None:
    assert decided(Attempt(status=204)) == Decision(action=Action.ACK)


@pytest.mark.parametrize("status", [400, 404, 413, 422])
def test_a_final_4xx_goes_to_the_dead_letter_subject_at_once(status: int) -> None:
    assert decided(Attempt(status=status)) == Decision(action=Action.DEAD_LETTER, error=f"HTTP {status}")


@pytest.mark.parametrize(
    "attempt",
    [
        pytest.param(Attempt(status=500), id="5xx"),
        pytest.param(Attempt(status=429), id="429"),
        pytest.param(Attempt(status=302), id="3xx"),
        pytest.param(Attempt(error="timeout"), id="timeout"),
        pytest.param(Attempt(error="connection error: ConnectError"), id="connection-error"),
    ],
)
def test_failures_are_redelivered_with_doubling_waits(attempt: Attempt) -> None:
    waits = [decided(attempt, number=n).delay for n in (1, 2, 3)]
    assert waits == [2.0, 4.0, 8.0]
    assert decided(attempt).action is Action.RETRY
    assert decided(attempt).error == attempt.problem


def test_waits_stop_growing_at_the_cap() -> None:
    assert decide(
        outcome_of(Attempt(status=503), now=NOW),
        number=4,
        age=0,
        rules=RedeliveryRules(max_attempts=50, max_age=3600, backoff_base=100, backoff_cap=300),
        random=lambda: 1.0,
    ) == Decision(action=Action.RETRY, delay=300, error="HTTP 503")


@pytest.mark.parametrize(
    ("retry_after", "wait"),
    [("7", 7.0), ("100000", 300.0), ("Tue, 14 Nov 2023 22:13:40 GMT", 20.0), ("soon", 2.0)],
)
def test_retry_after_is_honoured_up_to_the_cap(retry_after: str, wait: float) -> None:
    decision = decided(Attempt(status=503, retry_after=retry_after))
    assert (decision.action, decision.delay) == (Action.RETRY, wait)


def test_the_last_attempt_goes_to_the_dead_letter_subject_with_its_error() -> None:
    assert decided(Attempt(status=500), number=4).action is Action.RETRY
    assert decided(Attempt(status=500), number=5) == Decision(action=Action.DEAD_LETTER, error="HTTP 500")


def test_a_message_too_old_goes_to_the_dead_letter_subject_after_its_attempt() -> None:
    assert decided(Attempt(error="timeout"), number=1, age=3600) == Decision(action=Action.DEAD_LETTER, error="timeout")


def test_open_circuit_waits_for_the_breaker_and_spends_no_attempt() -> None:
    refused = Attempt(error="circuit open", circuit_open=True)
    assert decided(refused, number=99, circuit_wait=42.5) == Decision(
        action=Action.RETRY, delay=42.5, error="circuit open"
    )
    assert decided(refused, age=3600).action is Action.DEAD_LETTER


def test_decisions_need_only_the_target_neutral_outcome() -> None:
    """No HTTP here: a target that is not a webhook reports verdicts and a wait of its own."""
    asked = Outcome(verdict=Verdict.RETRY, problem="busy", retry_after=1000.0)
    assert decide(asked, number=1, age=0, rules=RULES, random=lambda: 1.0) == Decision(
        action=Action.RETRY, delay=300, error="busy"
    )
    refused = Outcome(verdict=Verdict.REJECTED, problem="no such mailbox")
    assert decide(refused, number=1, age=0, rules=RULES, random=lambda: 1.0) == Decision(
        action=Action.DEAD_LETTER, error="no such mailbox"
    )
