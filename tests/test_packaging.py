"""The three distributions agree with the development install (docs/installation.md).

The root ``pyproject.toml`` is the development install: every runtime dependency of every distribution, with the
specifier a user gets. ``distributions/<name>/pyproject.toml`` copies the specifiers; these tests keep them equal,
keep every root dependency in some distribution, and keep the version one number.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import bastion_core._extras
from bastion import _extras as bastion_extras
from mailrelay import _extras as mailrelay_extras
from mailrelay._version import __version__ as mailrelay_version

ROOT = Path(__file__).resolve().parents[1]
VERSION = "0.2.0"
DISTRIBUTIONS = ("bastion-core", "bastion", "mailrelay")


def _project(path: Path) -> dict[str, object]:
    project: dict[str, object] = tomllib.loads(path.read_text())["project"]
    return project


ROOT_PROJECT = _project(ROOT / "pyproject.toml")
PROJECTS = {name: _project(ROOT / "distributions" / name / "pyproject.toml") for name in DISTRIBUTIONS}


def _requirements(project: dict[str, object]) -> list[Requirement]:
    """The project's runtime requirements and its extras' (not its own distributions, not the root's dev, bench, docs
    and deploy tools)."""
    listed = [*project.get("dependencies", [])]  # type: ignore[misc]
    for extra, requirements in project.get("optional-dependencies", {}).items():  # type: ignore[attr-defined]
        if extra not in ("dev", "bench", "docs", "deploy", "all"):
            listed.extend(requirements)
    return [Requirement(text) for text in listed if not text.startswith(DISTRIBUTIONS)]


ROOT_REQUIREMENTS = {requirement.name: requirement for requirement in _requirements(ROOT_PROJECT)}


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_each_specifier_is_the_development_installs(name: str) -> None:
    for requirement in _requirements(PROJECTS[name]):
        assert requirement.name in ROOT_REQUIREMENTS, f"{name}: {requirement} is not in the root pyproject.toml"
        expected = ROOT_REQUIREMENTS[requirement.name]
        assert (requirement.specifier, requirement.extras, requirement.marker) == (
            expected.specifier,
            expected.extras,
            expected.marker,
        ), f"{name}: {requirement} differs from the root's {expected}"


def test_every_root_dependency_belongs_to_a_distribution() -> None:
    shipped = {requirement.name for project in PROJECTS.values() for requirement in _requirements(project)}
    assert set(ROOT_REQUIREMENTS) - shipped == set()


def test_the_programs_pin_the_core_of_their_release() -> None:
    for name in ("bastion", "mailrelay"):
        assert f"bastion-core=={VERSION}" in PROJECTS[name]["dependencies"]  # type: ignore[operator]


def test_one_version_everywhere() -> None:
    assert {project["version"] for project in (ROOT_PROJECT, *PROJECTS.values())} == {VERSION}
    assert mailrelay_version == VERSION
    assert (ROOT / "CHANGELOG.md").read_text().splitlines()[2] == f"## {VERSION}"


@pytest.mark.parametrize(
    ("distribution", "extras"), [("bastion", bastion_extras.EXTRAS), ("mailrelay", mailrelay_extras.EXTRAS)]
)
def test_the_extras_the_programs_name_are_the_distributions(
    distribution: str, extras: tuple[bastion_core._extras.Extra, ...]
) -> None:
    """The one-line error names an extra that exists; ``all`` brings every one of them."""
    declared = PROJECTS[distribution]["optional-dependencies"]
    assert {extra.name for extra in extras} | {"all"} == set(declared)  # type: ignore[arg-type]
    assert declared["all"] == [f"{distribution}[{','.join(extra.name for extra in extras)}]"]  # type: ignore[index]
    assert {extra.distribution for extra in extras} == {distribution}


def test_the_licence_files_exist() -> None:
    """Each distribution lists LICENSE and NOTICE (bastion also the vendored API-docs pages' licences)."""
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    for project in (ROOT_PROJECT, *PROJECTS.values()):
        assert project["license"] == "Apache-2.0"
        assert {"LICENSE", "NOTICE"} <= set(project["license-files"])  # type: ignore[arg-type]
    for path in PROJECTS["bastion"]["license-files"]:  # type: ignore[attr-defined]
        assert (ROOT / path).is_file(), path
