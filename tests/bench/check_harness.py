"""Smoke run of the benchmark harness (`make bench-check`, in CI): every scenario runs for a fraction of a second and
yields a number.

No timing is asserted (timings never go into pass/fail tests); the Python load generator is used so the run needs
no wrk. It starts every row's servers (about 40 s), so it is a target of its own beside `make test`, which keeps the
harness's unit tests (tests/bench/test_harness.py).
"""

from __future__ import annotations

import dataclasses
import re

import pytest

from bench import brokerload, cpus, harness, report, scenarios

SMOKE = harness.Options(rounds=1, duration=0.3, warmup=0.0, connections=4, loadgen="python", write=False)
SAME_PATHS_AS_A_SMOKED_ROW = {"bastion-secured POST", "bastion-secured-distributed plan 2 windows"}
"""Rows another smoked row already runs end to end (the POST with idempotency on; the local plan row, the distributed
row): each costs a server start (and a Valkey) in ``make test`` for no new code path. The shared-cores rows start the
same servers as their pinned twins; only their pinning differs (tests/bench/test_harness.py checks it)."""
NAMES = [
    scenario.name
    for scenario in scenarios.SCENARIOS
    if scenario.workers == 1 and not scenario.shared_cores and scenario.name not in SAME_PATHS_AS_A_SMOKED_ROW
]
MULTI_WORKER = tuple(scenario.name for scenario in scenarios.SCENARIOS if scenario.workers > 1)
"""Run by a fixture of their own: each starts several workers, each of which builds the app."""


@pytest.fixture(scope="module")
def results() -> dict[str, report.RowResult]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(brokerload, "BACKLOG", 20_000)  # plenty for 0.3 s; the real rows wait for 600,000
        return harness.run(dataclasses.replace(SMOKE, rows=tuple(NAMES)))


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_scenario_produces_a_number_or_says_why_not(results: dict[str, report.RowResult], name: str) -> None:
    row = results[name]
    assert row.failure is None, row.failure
    if row.unavailable is not None:
        assert row.unavailable.startswith("n/a ("), row.unavailable
        return
    [sample] = row.samples
    assert sample.requests > 0
    assert sample.non_2xx == 0 and sample.errors == 0, row.notes
    assert sample.rate > 0
    if row.scenario.kind != "broker":  # the broker rows measure throughput only (no per-message latency)
        assert sample.p50_ms > 0


@pytest.mark.slow
def test_document_has_one_table_row_per_scenario_and_every_target(results: dict[str, report.RowResult]) -> None:
    from datetime import UTC, datetime

    text = harness.document(results, SMOKE, profile=None, when=datetime(2026, 1, 2, tzinfo=UTC), took=90.0)
    table_rows = report.table(results).splitlines()[2:]
    assert [line.split(" | ")[0].lstrip("| ") for line in table_rows] == list(results)
    assert text.count("`bastion-secured` >= ") == 3
    assert "`bastion-secured` >= 1.3x `fastapi-documents`" in text
    assert "`bastion-secured` p99 <= 1.2x `starlette-documents`" in text
    assert "`bastion-secured (2 workers)` >= 1.6x `bastion-secured`" in text
    assert "`mailrelay (4 conn)` >= 0.75x" in text
    assert "- Took: 1.5 min (every round and the profiles)" in text
    assert f"`bastion-secured (2 workers)`: {cpus.placement(2).describe('workers')}" in text


@pytest.fixture(scope="module")
def multi_worker_results() -> dict[str, report.RowResult]:
    return harness.run(dataclasses.replace(SMOKE, rows=MULTI_WORKER))


@pytest.mark.slow
def test_the_two_worker_row_measures_both_workers(multi_worker_results: dict[str, report.RowResult]) -> None:
    row = multi_worker_results["bastion-secured (2 workers)"]
    assert row.failure is None and row.unavailable is None, row.failure or row.unavailable
    [sample] = row.samples
    assert sample.requests > 0 and sample.non_2xx == 0 and sample.errors == 0, row.notes
    assert sample.p50_ms > 0 and sample.p999_ms >= sample.p99_ms
    assert row.placement == cpus.placement(2)
    shares = row.notes["parts"]
    assert re.fullmatch(r"worker 1 / worker 2 CPU per round: \d+% / \d+%", shares), shares
