"""Each package's ``__all__`` is sorted and names only what the package really exports."""

from __future__ import annotations

import importlib

import pytest


@pytest.mark.parametrize(
    "name",
    [
        "bastion",
        "bastion.auth",
        "bastion.grpc",
        "bastion.middleware",
        "bastion.policy",
        "bastion.ratelimit",
        "bastion.routing",
    ],
)
def test_all_is_sorted_and_resolvable(name: str) -> None:
    module = importlib.import_module(name)
    exported = module.__all__
    assert exported == sorted(exported)
    for symbol in exported:
        assert hasattr(module, symbol), symbol
