"""The short version of every `make reliability` scenario (real processes on loopback), each figure within its
bound. The fuzz targets have their own test files; schemathesis runs in its own tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.scenarios import Workspace
from reliability.figures import table
from reliability.run import Context, run_scenario
from reliability.scenarios import SCENARIOS

PROCESS_SCENARIOS = [name for name in SCENARIOS if not name.startswith("fuzz-")]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    return Workspace.create(Path(tmp_path_factory.mktemp("reliability")))


@pytest.mark.slow
@pytest.mark.timeout(90)
@pytest.mark.parametrize("name", PROCESS_SCENARIOS)
def test_quick_scenario_meets_every_bound(name: str, workspace: Workspace) -> None:
    figures = run_scenario(name, SCENARIOS[name], Context(ws=workspace, quick=True))
    assert figures
    assert all(figure.ok for figure in figures), "\n" + table(figures)
