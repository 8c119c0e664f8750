"""`make deploy-check`: every file of deploy/ through its format's own checker (docs/deployment.md).

Not collected by `make test` (the checkers come with `make deploy-check`: the deploy extra and Debian's prometheus
package); .ci/run runs it. A checker that is missing fails its test with the command that installs it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.deploy.promql import DEPLOY

BIN = Path(sys.executable).parent
TIMEOUT_SECS = 120


def tool(name: str) -> str:
    found = shutil.which(name, path=f"{BIN}:/usr/bin:/usr/local/bin:/bin")
    assert found, f"{name} is not installed: run `make deploy-check` (it installs the checkers)"
    return found


def run(*command: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(part) for part in command], capture_output=True, text=True, timeout=TIMEOUT_SECS, check=False
    )


@pytest.mark.parametrize("program", ["bastion", "mailrelay"])
def test_hadolint_passes_on_the_dockerfile(program: str) -> None:
    result = run(tool("hadolint"), "--no-color", DEPLOY / program / "Dockerfile")
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_kubernetes_validate_passes_on_every_manifest() -> None:
    manifests = sorted((DEPLOY / "kubernetes").glob("*.yaml"))
    result = run(tool("kubernetes-validate"), "--strict", *manifests)
    assert result.returncode == 0, result.stdout + result.stderr
    passed = [line for line in result.stdout.splitlines() if " passed for resource " in line]
    assert len(passed) == 11  # bastion.yaml 5, mailrelay.yaml 6 (each but its ServiceMonitor)
    # The ServiceMonitor is a CRD without a schema here; tests/deploy/test_deploy_files.py checks its selector.
    skipped = [line for line in result.stdout.splitlines() if not line.startswith("INFO")]
    assert [line.split("Couldn't find schema for kind ")[1].split()[0] for line in skipped] == ["ServiceMonitor"] * 2


def test_check_jsonschema_validates_the_compose_file_against_the_compose_specification() -> None:
    compose = DEPLOY / "compose" / "compose.yaml"
    result = run(tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", compose)
    assert (result.returncode, result.stdout.strip()) == (0, "ok -- validation done"), result.stderr


def test_systemd_analyze_verify_passes_on_the_units(tmp_path: Path) -> None:
    """Copies whose ExecStart names the programs of this environment (the units' /opt/<program>/bin does not exist
    on a CI machine); every other line as written. systemd-analyze exits 0 on unknown keys, so any output fails."""
    units = []
    for program in ("bastion", "mailrelay"):
        unit = (DEPLOY / "systemd" / f"{program}.service").read_text()
        assert unit.count(f"ExecStart=/opt/{program}/bin/{program}") == 1
        copy = tmp_path / f"{program}.service"
        copy.write_text(unit.replace(f"ExecStart=/opt/{program}/bin/{program}", f"ExecStart={BIN / program}"))
        units.append(copy)
    result = run(tool("systemd-analyze"), "verify", *units)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_promtool_checks_the_alert_rules_and_the_scrape_configuration() -> None:
    rules = run(tool("promtool"), "check", "rules", DEPLOY / "prometheus" / "alerts.yml")
    assert rules.returncode == 0, rules.stdout + rules.stderr
    groups = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())["groups"]
    count = sum(len(group["rules"]) for group in groups)  # every rule of the file, none skipped
    assert f"SUCCESS: {count} rules found" in rules.stdout
    config = run(tool("promtool"), "check", "config", "--syntax-only", DEPLOY / "compose" / "prometheus.yml")
    assert config.returncode == 0, config.stdout + config.stderr
