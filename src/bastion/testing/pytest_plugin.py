"""pytest fixtures for testing a Bastion service: ``bastion_client`` and ``bastion_async_client``.

Loaded by the ``pytest11`` entry point of the installed ``bastion`` distribution (nothing to write), or by
``pytest_plugins = ["bastion.testing.pytest_plugin"]`` in the root ``conftest.py`` (or ``-p
bastion.testing.pytest_plugin``) when bastion is importable but not installed. The entry point carries the
module's name, so both at once register it once.

Override ``bastion_service`` (required: your :class:`~bastion.Service`), ``bastion_config`` (a TOML file, or
``None`` for the embedded defaults) and ``bastion_environ`` (``SERVICE_*`` overrides) in a ``conftest.py`` or a
test module. ``bastion_async_client`` exists when pytest-asyncio is installed. Both clear the service's
``dependency_overrides`` when the test ends. See docs/testing.md.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import TYPE_CHECKING

import pytest

from bastion.testing._client import AsyncServiceClient, ServiceClient

if TYPE_CHECKING:
    from bastion._service import Service


@pytest.fixture
def bastion_service() -> Service:
    """The service under test: override this fixture to return yours."""
    pytest.fail(
        "define a `bastion_service` fixture that returns your bastion.Service (in conftest.py or the test module), "
        "e.g.  @pytest.fixture\n  def bastion_service(): return service",
        pytrace=False,
    )


@pytest.fixture
def bastion_config() -> str | os.PathLike[str] | None:
    """The service's TOML configuration for the clients; ``None`` (the default) is the embedded defaults."""
    return None


@pytest.fixture
def bastion_environ() -> Mapping[str, str]:
    """``SERVICE_*`` overrides applied over ``bastion_config`` (the process environment is not read)."""
    return {}


@pytest.fixture
def bastion_client(
    bastion_service: Service, bastion_config: str | os.PathLike[str] | None, bastion_environ: Mapping[str, str]
) -> Iterator[ServiceClient]:
    """A started :class:`~bastion.testing.ServiceClient` for ``bastion_service``; stopped after the test, and
    the service's ``dependency_overrides`` cleared."""
    try:
        with ServiceClient(bastion_service, config=bastion_config, environ=bastion_environ) as client:
            yield client
    finally:
        bastion_service.dependency_overrides.clear()


if importlib.util.find_spec("pytest_asyncio") is not None:
    import pytest_asyncio

    @pytest_asyncio.fixture
    async def bastion_async_client(
        bastion_service: Service, bastion_config: str | os.PathLike[str] | None, bastion_environ: Mapping[str, str]
    ) -> AsyncIterator[AsyncServiceClient]:
        """A started :class:`~bastion.testing.AsyncServiceClient` (in the test's event loop); stopped after it, and
        the service's ``dependency_overrides`` cleared."""
        try:
            async with AsyncServiceClient(bastion_service, config=bastion_config, environ=bastion_environ) as client:
                yield client
        finally:
            bastion_service.dependency_overrides.clear()
