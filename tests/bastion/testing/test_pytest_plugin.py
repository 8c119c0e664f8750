"""The pytest plugin in a user's own pytest run: loaded by the pyproject's pytest11 entry point, warning-free.

A real ``python -m pytest`` runs a user's test files in a directory of their own, with ``-W error``. The entry
point comes from this repository's pyproject.toml, declared by a stand-in distribution on the path (the run
must not depend on how, or whether, bastion itself was installed).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"

USER_TESTS = """
import sys

import pytest
from fastapi import Depends

from bastion import Service

service = Service("probe-api", version="1.0.0")
v1 = service.version(1)


def get_store() -> str:
    return "real"


@v1.get("/ping")
async def ping() -> dict[str, str]:
    return {"pong": "yes"}


@v1.get("/store")
async def store(name: str = Depends(get_store)) -> dict[str, str]:
    return {"store": name}


@pytest.fixture
def bastion_service():
    return service


def test_sync_client(bastion_client):
    assert bastion_client.get("/api/v1/ping").status_code == 401
    assert bastion_client.as_user("alice").get("/api/v1/ping").json() == {"pong": "yes"}


@pytest.mark.asyncio
async def test_async_client(bastion_async_client):
    assert (await bastion_async_client.as_user("alice").get("/api/v1/ping")).json() == {"pong": "yes"}


def test_an_override_applies_in_its_test(bastion_client):
    bastion_client.app.dependency_overrides[get_store] = lambda: "fake"
    assert bastion_client.as_user("alice").get("/api/v1/store").json() == {"store": "fake"}


def test_the_fixture_cleared_the_override_of_the_test_before(bastion_client):
    assert service.dependency_overrides == {}
    assert bastion_client.as_user("alice").get("/api/v1/store").json() == {"store": "real"}


def test_starlette_testclient_is_never_imported():
    assert "starlette.testclient" not in sys.modules
"""

FORGOTTEN_SERVICE = """
def test_forgot_the_service(bastion_client):
    pass
"""


def entry_points() -> str:
    """The ``[pytest11]`` section of pyproject.toml as an ``entry_points.txt``."""
    declared = tomllib.loads(PYPROJECT.read_text())["project"]["entry-points"]["pytest11"]
    assert declared, "pyproject.toml declares no pytest11 entry point"
    return "[pytest11]\n" + "".join(f"{name} = {target}\n" for name, target in declared.items())


@pytest.fixture(scope="module", params=["entry point", "entry point and pytest_plugins"])
def user_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The output of a user's pytest run over USER_TESTS and FORGOTTEN_SERVICE, in a directory of its own."""
    root = tmp_path_factory.mktemp("user-project")
    dist = root / "site" / "bastion_probe-0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: bastion-probe\nVersion: 0\n")
    (dist / "entry_points.txt").write_text(entry_points())
    project = root / "project"
    project.mkdir()
    # pytest-asyncio's own deprecation warning asks every project to choose this (nothing of bastion's).
    (project / "pytest.ini").write_text("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    (project / "test_user.py").write_text(textwrap.dedent(USER_TESTS))
    (project / "test_forgotten.py").write_text(textwrap.dedent(FORGOTTEN_SERVICE))
    if request.param == "entry point and pytest_plugins":
        (project / "conftest.py").write_text('pytest_plugins = ["bastion.testing.pytest_plugin"]\n')
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root / "site"), os.environ.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-W", "error", "-p", "no:cacheprovider", "--color=no"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return result.stdout + result.stderr


def test_the_fixtures_work_without_a_warning(user_run: str) -> None:
    summary = user_run.strip().splitlines()[-1]
    assert re.fullmatch(r"5 passed, 1 error in [0-9.]+s", summary), user_run


def test_a_forgotten_service_fixture_is_named(user_run: str) -> None:
    assert (
        "define a `bastion_service` fixture that returns your bastion.Service (in conftest.py or the test module)"
        in user_run
    ), user_run
