"""The example's policy-test case file, through the pytest helper (what ``bastion policy test`` runs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bastion.testing import check_policy_cases
from examples.documents_api import service
from tests.conftest import REPO

EXAMPLE = REPO / "examples" / "documents_api"


def test_the_examples_policy_cases_pass() -> None:
    results = check_policy_cases(EXAMPLE / "policies.cedar", EXAMPLE / "policy-cases.toml", service=service)
    assert len(results) == 7


def test_a_failing_case_fails_the_test_with_its_line(tmp_path: Path) -> None:
    cases = tmp_path / "cases.toml"
    cases.write_text('[[case]]\nname = "anonymous lists"\naction = "GET /api/v2/documents"\nexpect = "allow"\n')
    with pytest.raises(AssertionError) as caught:
        check_policy_cases(EXAMPLE / "policies.cedar", cases, service=service)
    assert str(caught.value) == "1 of 1 policy cases failed:\nFAIL anonymous lists: expected allow, got deny"
