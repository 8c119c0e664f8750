"""Unit tests of the benchmark harness: targets, placement, load generators' arguments, profiles, statistics.

The smoke run that starts every row is tests/bench/check_harness.py (`make bench-check`). No timing is asserted.
"""

from __future__ import annotations

import dataclasses
import math

from bench import cpus, loadgen, profile, pyload, report, scenarios, stats


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


def _row(name: str, rate: float, p99: float, placement: cpus.Placement = cpus.DEFAULT) -> report.RowResult:
    by_name = {scenario.name: scenario for scenario in scenarios.SCENARIOS}
    sample = loadgen.Sample(
        requests=int(rate), seconds=1.0, non_2xx=0, errors=0, p50_ms=1.0, p99_ms=p99, p999_ms=2 * p99, loadgen="wrk"
    )
    return report.RowResult(scenario=by_name[name], samples=[sample], placement=placement)


def test_a_p99_target_compares_median_tails_and_a_rate_target_median_rates() -> None:
    results = {
        "starlette-documents": _row("starlette-documents", 1000, 10.0),
        "bastion-secured": _row("bastion-secured", 650, 13.0),
        "bastion-open": _row("bastion-open", 790, 11.0),
    }
    lines = report.targets(results).splitlines()
    assert "- `bastion-secured` >= 0.6x `starlette-documents`: 0.65x, met" in lines
    assert "- `bastion-open` >= 0.8x `starlette-documents`: 0.79x, MISSED" in lines
    assert "- `bastion-secured` p99 <= 1.2x `starlette-documents`: 1.30x, MISSED" in lines
    assert "- `bastion-open` p99 <= 1.2x `starlette-documents`: 1.10x, met" in lines
    assert "- `bastion-secured` >= 1.3x `fastapi-documents`: not measured (validly) in this run" in lines


def test_a_target_over_a_row_with_failures_shows_its_figure_but_no_verdict() -> None:
    failed = _row("bastion-secured", 700, 13.0)
    failed.samples.append(dataclasses.replace(failed.samples[0], non_2xx=3))
    baseline = _row("starlette-documents", 1000, 10.0)
    lines = report.targets({"starlette-documents": baseline, "bastion-secured": failed}).splitlines()
    verdict = "0.70x, not valid (a row failed or had errors: see the table)"
    assert f"- `bastion-secured` >= 0.6x `starlette-documents`: {verdict}" in lines


def test_two_workers_are_placed_one_cpu_each_away_from_the_load_generator_given_three_cpus() -> None:
    placement = cpus.placement(2, available=[3, 0, 1, 2], pin=True)
    assert (placement.loadgen, placement.servers, placement.pinned) == ({0}, {1, 2}, True)
    assert placement.unmeasurable is None
    assert placement.describe("workers") == "load generator on CPU [0], workers on CPU [1, 2]"


def test_two_workers_on_two_cpus_run_unpinned_and_say_why_scaling_is_not_measurable() -> None:
    placement = cpus.placement(2, available=[0, 1], pin=True)
    assert (placement.loadgen, placement.servers, placement.pinned) == ({0, 1}, {0, 1}, False)
    assert placement.unmeasurable == "not measurable on 2 cores: the load generator and two workers share them"
    assert placement.server_preexec() is None and placement.loadgen_preexec() is None


def test_the_scaling_target_is_judged_only_where_the_workers_had_cores_of_their_own() -> None:
    goal = "- `bastion-secured (2 workers)` >= 1.6x `bastion-secured`: "
    for available, rate, verdict in [
        ([0, 1], 1700, "1.70x, not measurable on 2 cores: the load generator and two workers share them"),
        ([0, 1, 2], 1700, "1.70x, met"),
        ([0, 1, 2], 1500, "1.50x, MISSED"),
    ]:
        placement = cpus.placement(2, available=available, pin=True)
        results = {
            "bastion-secured": _row("bastion-secured", 1000, 10.0),
            "bastion-secured (2 workers)": _row("bastion-secured (2 workers)", rate, 10.0, placement),
        }
        assert goal + verdict in report.targets(results).splitlines()


def test_every_row_shows_its_tail_or_that_its_generator_has_none() -> None:
    broker = report.RowResult(
        scenario=next(s for s in scenarios.SCENARIOS if s.kind == "broker"),
        samples=[
            loadgen.Sample(
                requests=9, seconds=1.0, non_2xx=0, errors=0, p50_ms=math.nan, p99_ms=math.nan, loadgen="jetstream"
            )
        ],
    )
    text = report.table({"starlette": _row("starlette", 1000, 10.0), "broker": broker})
    assert "| p50 ms | p99 ms | p99.9 ms |" in text.splitlines()[0]
    assert "| 1.00 | 10.00 | 20.00 |" in text.splitlines()[2]
    assert "| n/a | n/a | n/a |" in text.splitlines()[3]


def test_every_load_generator_reports_p999_and_the_slowest_request() -> None:
    result = stats.load_result([i / 1000 for i in range(1, 2001)], seconds=1.0, non_2xx=0, errors=0)
    assert (result["p99_ms"], result["p999_ms"], result["max_ms"]) == (1980.0, 1998.0, 2000.0)
    assert "latency:percentile(99.9)" in loadgen.WRK_SCRIPT and "latency.max" in loadgen.WRK_SCRIPT


def test_the_shared_cores_rows_start_their_processes_unpinned_and_have_a_target() -> None:
    with cpus.shared_cores():
        assert cpus.server_preexec() is None and cpus.loadgen_preexec() is None
    assert (cpus.server_preexec() is None) is (not cpus.PINNED)  # pinned again after the block, where pinning is on
    shared = [scenario.name for scenario in scenarios.SCENARIOS if scenario.shared_cores]
    assert shared == ["bastion-secured (shared cores)", "bastion-secured access-log (shared cores)"]
    assert report.Target(row=shared[1], against=shared[0], factor=0.9) in report.TARGETS


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


def test_a_feature_target_is_judged_by_its_paired_rounds_and_shows_the_rounds_figure_too() -> None:
    """Paired rounds (the two rows back to back) decide a feature's cost; without them the medians of the rounds do."""
    post = _row("bastion-secured POST", 1000, 10.0)
    idempotent = _row("bastion-secured POST idempotency", 850, 10.0)
    results = {"bastion-secured POST": post, "bastion-secured POST idempotency": idempotent}
    goal = "- `bastion-secured POST idempotency` >= 0.9x `bastion-secured POST`: "
    assert goal + "0.85x, MISSED" in report.targets(results).splitlines()
    idempotent.paired = [
        (_row("bastion-secured POST", without, 10.0).samples[0], _row("bastion-secured POST", with_, 10.0).samples[0])
        for without, with_ in ((1000, 950), (900, 800), (1000, 910))
    ]
    verdict = "0.91x, met (median of 3 paired rounds: 0.95, 0.89, 0.91; medians of the rounds: 0.85x)"
    assert goal + verdict in report.targets(results).splitlines()
    assert "| bastion-secured POST idempotency | 2 | 900 | 800 | 0.89 |" in report.paired_table(results).splitlines()
