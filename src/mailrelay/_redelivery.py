"""Queue mode's rule for one delivery's outcome: acknowledge, redeliver later (and when), or dead-letter.

Pure: no I/O, no clock, no HTTP (the target judged the answer); the workers (`_workers.py`) act on the Decision.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from bastion_core import backoff_delay
from mailrelay._target import Outcome, Verdict

DEFAULT_BACKOFF_CAP_SECS = 300.0  # a queued message waits at most this long between two attempts


class Action(enum.Enum):
    ACK = "ack"  # delivered: the message leaves the stream
    RETRY = "retry"  # nak with a delay: the stream redelivers it (to this relay or another)
    DEAD_LETTER = "dead_letter"  # give up: to the dead-letter subject with the last error, then ack


@dataclass(frozen=True, slots=True, kw_only=True)
class RedeliveryRules:
    """`max_attempts` deliveries in all, or `max_age` seconds after the relay accepted the message, whichever comes
    first; waits grow from `backoff_base` (doubling, jittered) up to `backoff_cap`, or follow Retry-After."""

    max_attempts: int
    max_age: float
    backoff_base: float
    backoff_cap: float = DEFAULT_BACKOFF_CAP_SECS


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    action: Action
    delay: float = 0.0
    error: str | None = None
    """The last error, for the dead-letter subject and the log."""


def decide(
    outcome: Outcome,
    *,
    number: int,
    age: float,
    rules: RedeliveryRules,
    circuit_wait: float = 0.0,
    random: Callable[[], float],
) -> Decision:
    """What to do after delivery `number` (1 for the first) of a message accepted `age` seconds ago.

    Delivered: ack. Rejected: dead letter at once (the receiver refused it for good; the sender already had its
    250). Retry or unexpected (webhook: a timeout, a connection error, 5xx, 408, 429, 1xx or 3xx): redeliver after
    the wait the target asked for (Retry-After), capped, or the backoff, unless this was the last attempt or the
    message is too old: then dead letter. The breaker refusing the attempt (nothing sent) retries after
    `circuit_wait` and dead-letters only by age, since no attempt was made.
    """
    verdict = outcome.verdict
    if verdict is Verdict.DELIVERED:
        return Decision(action=Action.ACK)
    if verdict is Verdict.REJECTED:
        return Decision(action=Action.DEAD_LETTER, error=outcome.problem)
    too_old = age >= rules.max_age
    if verdict is Verdict.CIRCUIT_OPEN:
        if too_old:
            return Decision(action=Action.DEAD_LETTER, error=outcome.problem)
        return Decision(action=Action.RETRY, delay=min(rules.backoff_cap, circuit_wait), error=outcome.problem)
    if too_old or number >= rules.max_attempts:
        return Decision(action=Action.DEAD_LETTER, error=outcome.problem)
    if outcome.retry_after is not None:
        waited = min(rules.backoff_cap, outcome.retry_after)
    else:
        waited = backoff_delay(number, base=rules.backoff_base, cap=rules.backoff_cap, random=random)
    return Decision(action=Action.RETRY, delay=waited, error=outcome.problem)
