"""Canonical paths: merged slashes and resolved dot segments, so no layer sees a different path than the router."""

from __future__ import annotations

import pytest

from bastion.errors import BadRequest
from bastion.routing._paths import canonical_path


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("/api/v1/documents", "/api/v1/documents"),
        ("//api/v1/x", "/api/v1/x"),
        ("/api//v1///x", "/api/v1/x"),
        ("/api/v1/../v1/x", "/api/v1/x"),
        ("/api/v1/./admin/users", "/api/v1/admin/users"),
        ("/api/v1/documents/../admin/users", "/api/v1/admin/users"),
        ("/../../etc/passwd", "/etc/passwd"),
        ("/a/b/..", "/a/"),
        ("/a/b/.", "/a/b/"),
        ("/a/b/", "/a/b/"),
        ("/", "/"),
        ("/%2e%2e/x", "/%2e%2e/x"),
        ("/a/.hidden/..b", "/a/.hidden/..b"),
    ],
)
def test_canonical_path(raw: str, canonical: str) -> None:
    assert canonical_path(raw) == canonical


@pytest.mark.parametrize("raw", ["api/v1", "/a\x00b", "/a\nb", "/a\x7fb", ""])
def test_invalid_paths_are_bad_requests(raw: str) -> None:
    with pytest.raises(BadRequest):
        canonical_path(raw)
