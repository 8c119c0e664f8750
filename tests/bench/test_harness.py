"""Smoke test of the benchmark harness: every scenario runs for a fraction of a second and yields a number.

No timing is asserted (timings never go into pass/fail tests); the Python load generator is used so the
test needs no wrk. The peer stack needs the ``bench`` extra (PyJWT, slowapi) and is skipped without it.
"""

from __future__ import annotations

import dataclasses

import pytest

from bench import brokerload, harness, loadgen, profile, pyload, report, scenarios, stats

SMOKE = harness.Options(rounds=1, duration=0.3, warmup=0.0, connections=4, loadgen="python", write=False)
SAME_PATHS_AS_A_SMOKED_ROW = {"bastion-secured POST", "bastion-secured-distributed plan 2 windows"}
"""Rows another smoked row already runs end to end (the POST with idempotency on; the local plan row, the distributed
row): each costs a server start (and a Valkey) in ``make test`` for no new code path."""
NAMES = [scenario.name for scenario in scenarios.SCENARIOS if scenario.name not in SAME_PATHS_AS_A_SMOKED_ROW]


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

    text = harness.document(results, SMOKE, profile=None, when=datetime(2026, 1, 2, tzinfo=UTC))
    table_rows = report.table(results).splitlines()[2:]
    assert [line.split(" | ")[0].lstrip("| ") for line in table_rows] == list(results)
    assert text.count("`bastion-secured` >= ") == 3
    assert "`bastion-secured` >= 1.0x `fastapi-documents`" in text
    assert "`bastion-secured` p99 <= 1.5x `fastapi-documents`" in text
    assert "`mailrelay (4 conn)` >= 0.5x" in text


def test_profile_folds_collapsed_stacks_by_layer_file_and_function() -> None:
    collapsed = "\n".join(
        [
            "main (bastion/cli.py:1);Outer.__call__ (bastion/a.py:5);Inner.__call__ (bastion/b.py:9) 3",
            "main (bastion/cli.py:1);Outer.__call__ (bastion/a.py:6);send (uvicorn/protocols/x.py:2) 1",
        ]
    )
    folded = profile.fold(collapsed)
    assert folded.total == 4
    assert folded.by_layer["Inner (bastion/b.py)"] == 3
    assert folded.by_layer["uvicorn (HTTP protocol, socket writes)"] == 1
    assert folded.by_file["bastion/b.py"] == 3
    assert folded.inclusive["Outer.__call__ (bastion/a.py)"] == 4


def test_percentile_is_nearest_rank() -> None:
    assert stats.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0
    assert stats.percentile([1.0, 2.0, 3.0, 4.0], 99) == 4.0


def test_a_p99_target_compares_median_tails_and_a_rate_target_median_rates() -> None:
    by_name = {scenario.name: scenario for scenario in scenarios.SCENARIOS}

    def row(name: str, rate: float, p99: float) -> report.RowResult:
        sample = loadgen.Sample(
            requests=int(rate), seconds=1.0, non_2xx=0, errors=0, p50_ms=1.0, p99_ms=p99, loadgen="wrk"
        )
        return report.RowResult(scenario=by_name[name], samples=[sample])

    results = {
        "fastapi-documents": row("fastapi-documents", 1000, 10.0),
        "bastion-secured": row("bastion-secured", 1100, 16.0),
        "bastion-open": row("bastion-open", 1100, 14.0),
    }
    lines = report.targets(results).splitlines()
    assert "- `bastion-secured` >= 1.0x `fastapi-documents`: 1.10x, met" in lines
    assert "- `bastion-open` >= 1.2x `fastapi-documents`: 1.10x, MISSED" in lines
    assert "- `bastion-secured` p99 <= 1.5x `fastapi-documents`: 1.60x, MISSED" in lines
    assert "- `bastion-open` p99 <= 1.5x `fastapi-documents`: 1.40x, met" in lines


def test_the_python_generator_sends_a_fresh_header_value_with_each_post() -> None:
    _host, _port, request = pyload.build_request(
        "http://127.0.0.1:1/api", [], method="POST", body=b"{}", fresh_header="Idempotency-Key"
    )
    first, second = request.next(), request.next()
    assert first.startswith(b"POST /api HTTP/1.1\r\n") and b"\r\nContent-Length: 2\r\n" in first
    assert first.endswith(b"-1\r\n\r\n{}") and second.endswith(b"-2\r\n\r\n{}")
    assert first.split(b"Idempotency-Key: ")[1][:32] == second.split(b"Idempotency-Key: ")[1][:32]


def test_wrk_gets_a_request_script_only_for_a_post_or_a_fresh_header() -> None:
    assert loadgen.wrk_request_script("GET", b"", None) == ""
    script = loadgen.wrk_request_script("POST", b'{"a": 1}', "Idempotency-Key")
    assert 'wrk.method = "POST"' in script and 'wrk.body = [[{"a": 1}]]' in script
    assert 'headers["Idempotency-Key"] = "' in script
