"""Fixtures for the Bastion end-to-end tests: one token minter per module and the env that trusts its key."""

from __future__ import annotations

import pytest

from bastion.testing import TokenMinter


@pytest.fixture(scope="module")
def minter() -> TokenMinter:
    return TokenMinter("RS256")


@pytest.fixture(scope="module")
def key_env(minter: TokenMinter, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The example's config with this module's public key instead of the developer's .dev key."""
    path = tmp_path_factory.mktemp("keys") / "public.pem"
    path.write_bytes(minter.public_pem())
    return {"SERVICE_TOKEN_PUBLIC_KEY_PATH": str(path)}
