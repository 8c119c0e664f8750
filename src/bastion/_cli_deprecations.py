"""``bastion deprecations report --metrics URL``: who still calls deprecated API versions, from the
``api_version_requests`` counter of a running service (its ``caller`` label: ``metrics.version_callers``)."""

from __future__ import annotations

import argparse
from collections import defaultdict
from typing import Any

from bastion.errors import ConfigError

EXIT_OK = 0
MAX_METRICS_BYTES = 32 * 1024 * 1024
"""The most of a metrics page the report reads: a scrape page is far smaller; past it, one error line."""
DEFAULT_TIMEOUT_SECS = 10.0
METRIC = "api_version_requests"


def _scrape(url: str, timeout: float) -> str:
    import httpx

    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"--metrics {url!r} must be an http:// or https:// URL, e.g. http://127.0.0.1:8080/metrics")
    chunks: list[bytes] = []
    size = 0
    try:
        with httpx.stream("GET", url, timeout=timeout) as response:
            if response.status_code != 200:
                raise ConfigError(f"--metrics {url!r} answered {response.status_code}, expected 200")
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > MAX_METRICS_BYTES:
                    raise ConfigError(f"--metrics {url!r} sent more than {MAX_METRICS_BYTES} bytes")
                chunks.append(chunk)
    except httpx.HTTPError as exc:
        raise ConfigError(f"cannot read --metrics {url!r}: {type(exc).__name__}: {exc}") from None
    return b"".join(chunks).decode("utf-8", errors="replace")


def usage(text: str) -> dict[tuple[str, str], dict[str, float]]:
    """``{(version, replacement): {caller: requests}}`` of the deprecated versions in a Prometheus text page
    (``caller`` is ``(not recorded)`` when the service counts without ``metrics.version_callers``)."""
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise ConfigError(f"the metrics page is not Prometheus text: {exc}") from None
    for family in families:
        for sample in family.samples:
            labels = sample.labels
            if sample.name != f"{METRIC}_total" or labels.get("deprecated") != "true":
                continue
            key = (labels.get("version", "?"), labels.get("replacement_version", "?"))
            found[key][labels.get("caller", "(not recorded)")] += sample.value
    return {key: dict(callers) for key, callers in sorted(found.items())}


def _report(args: argparse.Namespace) -> int:
    found = usage(_scrape(args.metrics, args.timeout))
    if not found:
        print(f"no requests to deprecated versions in {args.metrics}")
        return EXIT_OK
    for (version, replacement), callers in found.items():
        total = sum(callers.values())
        print(f"{version} (deprecated, replacement {replacement}): {total:g} requests from {len(callers)} callers")
        for caller, count in sorted(callers.items(), key=lambda item: (-item[1], item[0])):
            print(f"  {count:>10g}  {caller}")
    return EXIT_OK


def add_deprecation_commands(commands: Any) -> None:
    """The ``deprecations`` command on the ``bastion`` parser's subparsers."""
    deprecations = commands.add_parser("deprecations", help="who still calls deprecated API versions")
    sub = deprecations.add_subparsers(dest="deprecations_command", required=True)
    report = sub.add_parser(
        "report", help="list each deprecated version's callers from a service's metrics (metrics.version_callers)"
    )
    report.add_argument("--metrics", required=True, metavar="URL", help="e.g. http://127.0.0.1:8080/metrics")
    report.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_SECS, help="seconds (default: 10)")
    report.set_defaults(handler=_report)
