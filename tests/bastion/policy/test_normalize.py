"""The default action normalizer for unmatched paths."""

from __future__ import annotations

import pytest

from bastion.policy._normalize import default_normalizer


@pytest.mark.parametrize(
    ("path", "action_path"),
    [
        pytest.param("/api/v1/orders/42", "/api/v1/orders/{id}", id="numeric"),
        pytest.param("/api/v1/orders/3F2504E0-4F89-11D3-9A0C-0305E82C3301", "/api/v1/orders/{id}", id="uuid-upper"),
        pytest.param("/api/v2/a/3f2504e0-4f89-11d3-9a0c-0305e82c3301/b/7", "/api/v2/a/{id}/b/{id}", id="mixed"),
        pytest.param("/api/v1/users/alice", "/api/v1/users/alice", id="slug-kept"),
        pytest.param("/api/v12/x", "/api/v12/x", id="version-kept"),
        pytest.param("/api/v1/orders/42abc", "/api/v1/orders/42abc", id="not-numeric"),
        pytest.param("/", "/", id="root"),
    ],
)
def test_default_normalizer(path: str, action_path: str) -> None:
    assert default_normalizer(path) == action_path
