"""Reading a metrics scrape in tests: Prometheus text parsed by prometheus_client's own parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def samples(text: str, prefix: str) -> dict[str, float]:
    """Every sample whose name starts with `prefix`, keyed as written (`name{label="value",...}`, labels sorted);
    the `_created` timestamps of counters and histograms are left out."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith(prefix) or sample.name.endswith("_created"):
                continue
            labels = ",".join(f'{name}="{value}"' for name, value in sorted(sample.labels.items()))
            found[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return found


def label_values(text: str, prefix: str) -> dict[str, set[str]]:
    """For the samples whose name starts with `prefix`: each label name and every value it takes."""
    values: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith(prefix):
                for name, value in sample.labels.items():
                    values.setdefault(name, set()).add(value)
    return values
