"""The in-memory broker's subject rules (pure): NATS's wildcards, and when two streams' subjects overlap."""

from __future__ import annotations

import pytest

from bastion.broker._memory import subject_matches, subjects_overlap


@pytest.mark.parametrize(
    ("pattern", "subject", "matches"),
    [
        pytest.param("orders.placed", "orders.placed", True, id="exact"),
        pytest.param("orders.placed", "orders.placed.eu", False, id="exact-longer"),
        pytest.param("orders.*", "orders.placed", True, id="star-one-token"),
        pytest.param("orders.*", "orders.placed.eu", False, id="star-not-two"),
        pytest.param("orders.*", "orders", False, id="star-not-zero"),
        pytest.param("*.placed", "orders.placed", True, id="star-first"),
        pytest.param("orders.>", "orders.placed.eu", True, id="rest-many"),
        pytest.param("orders.>", "orders.placed", True, id="rest-one"),
        pytest.param("orders.>", "orders", False, id="rest-not-zero"),
        pytest.param(">", "orders", True, id="everything"),
        pytest.param("orders.*.eu.>", "orders.placed.eu.fr", True, id="both"),
    ],
)
def test_subject_matches_as_nats_does(pattern: str, subject: str, matches: bool) -> None:
    assert subject_matches(pattern, subject) is matches


@pytest.mark.parametrize(
    ("first", "second", "overlap"),
    [
        pytest.param("orders.>", "orders.placed", True, id="rest-covers"),
        pytest.param("orders.*", "orders.placed.eu", False, id="star-one-token"),
        pytest.param("orders.*", "*.placed", True, id="stars-cross"),
        pytest.param("orders.>", "orders", False, id="rest-needs-a-token"),
        pytest.param("orders.>", "invoices.>", False, id="different-roots"),
    ],
)
def test_subjects_overlap_when_one_subject_matches_both(first: str, second: str, overlap: bool) -> None:
    assert subjects_overlap(first, second) is overlap
    assert subjects_overlap(second, first) is overlap
