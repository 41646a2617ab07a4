"""Read a server's /metrics with prometheus_client's own parser."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

Families = dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]


async def scrape(http_url: str) -> Families:
    """family -> {(sample name, sorted labels) -> value}."""
    async with httpx.AsyncClient(base_url=http_url) as http:
        response = await http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    return {
        family.name: {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for sample in family.samples
        }
        for family in text_string_to_metric_families(response.text)
    }


def value(families: Families, family: str, sample: str, **labels: str) -> float:
    return families.get(family, {}).get((sample, tuple(sorted(labels.items()))), 0.0)


def grew(before: Families, after: Families, family: str, sample: str, **labels: str) -> float:
    return value(after, family, sample, **labels) - value(before, family, sample, **labels)
