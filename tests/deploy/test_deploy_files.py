"""What deploy/ promises that the formats' own checkers (make deploy-check) cannot see: images of non-root users
built only from dist/'s wheels with a health check, shutdown timings that fit the programs' drains, selectors that
select, runbooks that exist, and configurations the programs accept. No tool, no network: part of `make test`."""

from __future__ import annotations

import importlib.util
import json
import re
import threading
import time
import tomllib
from http.server import ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import yaml

from bastion import load_settings
from bastion.testing import TokenMinter
from mailrelay import compute_signature
from tests.deploy.promql import DEPLOY, dashboard_expressions, rules

REPO = DEPLOY.parent
DOCKERFILES = {"bastion": DEPLOY / "bastion" / "Dockerfile", "mailrelay": DEPLOY / "mailrelay" / "Dockerfile"}
MANIFESTS = {"bastion": DEPLOY / "kubernetes" / "bastion.yaml", "mailrelay": DEPLOY / "kubernetes" / "mailrelay.yaml"}
UNITS = {"bastion": DEPLOY / "systemd" / "bastion.service", "mailrelay": DEPLOY / "systemd" / "mailrelay.service"}


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n\s*", " ", dockerfile.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def final_stage(dockerfile: Path) -> list[tuple[str, str]]:
    steps = instructions(dockerfile)
    last_from = max(index for index, (name, _) in enumerate(steps) if name == "FROM")
    return steps[last_from:]


def documents(path: Path) -> list[dict[str, object]]:
    return [document for document in yaml.safe_load_all(path.read_text()) if document]


def of_kind(path: Path, kind: str) -> list[dict]:  # type: ignore[type-arg]
    return [document for document in documents(path) if document["kind"] == kind]


@pytest.mark.parametrize("program", DOCKERFILES)
def test_the_image_runs_as_a_non_root_user_with_a_health_check(program: str) -> None:
    stage = final_stage(DOCKERFILES[program])
    users = [arguments for name, arguments in stage if name == "USER"]
    assert users == ["10001:10001"]
    healthchecks = [arguments for name, arguments in stage if name == "HEALTHCHECK"]
    assert len(healthchecks) == 1
    assert "http://127.0.0.1:8080/health" in healthchecks[0]
    entrypoint = [arguments for name, arguments in stage if name == "ENTRYPOINT"]
    assert len(entrypoint) == 1 and entrypoint[0].startswith("["), "exec form: the program is PID 1 and gets SIGTERM"


@pytest.mark.parametrize("program", DOCKERFILES)
def test_the_image_installs_only_the_wheels_of_dist(program: str) -> None:
    steps = instructions(DOCKERFILES[program])
    copies = [arguments for name, arguments in steps if name == "COPY" and "--from=" not in arguments]
    assert "dist/ /wheels/" in copies
    assert not [copy for copy in copies if copy.split()[0] in (".", "src", "src/", "distributions/")]
    installs = [arguments for name, arguments in steps if name == "RUN" and "pip install" in arguments]
    assert len(installs) == 1
    # "$(ls /wheels/NAME-*.whl)[extras]": the one wheel of that name, with its extras
    wanted = re.sub(r'"\$\(ls (\S+)\)\[[\w,]+\]"', r"\1", installs[0].split("pip install", 1)[1]).split()
    assert wanted, "the install names its wheels"
    assert all("/wheels/" in argument for argument in wanted), wanted
    assert {argument.split("/wheels/")[1].split("-")[0] for argument in wanted} == {"bastion_core", program}


@pytest.mark.parametrize("program", DOCKERFILES)
def test_no_secret_is_baked_into_the_image(program: str) -> None:
    for name, arguments in instructions(DOCKERFILES[program]):
        if name in ("ENV", "ARG"):
            assert not re.search(r"SECRET|PASSWORD|TOKEN|KEY", arguments), arguments


def bastion_config() -> str:
    (config_map,) = of_kind(MANIFESTS["bastion"], "ConfigMap")
    return str(config_map["data"]["config.toml"])


def pod_spec(program: str) -> dict:  # type: ignore[type-arg]
    (deployment,) = of_kind(MANIFESTS[program], "Deployment")
    return deployment["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def test_kubernetes_grace_period_covers_the_pre_stop_and_the_drain() -> None:
    drains = {
        "bastion": tomllib.loads(bastion_config())["service"]["graceful_shutdown_secs"],
        "mailrelay": int(of_kind(MANIFESTS["mailrelay"], "ConfigMap")[0]["data"]["MAIL_RELAY_SHUTDOWN_GRACE"]),
    }
    for program, drain in drains.items():
        spec = pod_spec(program)
        pre_stop = spec["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"]
        assert (pre_stop, drain, spec["terminationGracePeriodSeconds"]) == (5, 30, 45), program


def test_kubernetes_probes_liveness_on_health_and_readiness_on_ready() -> None:
    probes = {
        program: (
            container["livenessProbe"]["httpGet"]["path"],
            container["readinessProbe"]["httpGet"]["path"],
            container["resources"]["requests"].keys() >= {"cpu", "memory"},
        )
        for program in MANIFESTS
        for container in pod_spec(program)["containers"]
    }
    assert probes == {"bastion": ("/health", "/ready", True), "mailrelay": ("/health", "/health", True)}


@pytest.mark.parametrize("program", MANIFESTS)
def test_kubernetes_selectors_select_the_pods_and_ports(program: str) -> None:
    (deployment,) = of_kind(MANIFESTS[program], "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    services = of_kind(MANIFESTS[program], "Service")
    for service in services:
        assert service["spec"]["selector"].items() <= pod_labels.items()
    (budget,) = of_kind(MANIFESTS[program], "PodDisruptionBudget")
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (monitor,) = of_kind(MANIFESTS[program], "ServiceMonitor")
    wanted = monitor["spec"]["selector"]["matchLabels"].items()
    monitored = [service for service in services if wanted <= service["metadata"]["labels"].items()]
    assert len(monitored) == 1
    ports = {port["name"] for port in monitored[0]["spec"]["ports"]}
    assert [(endpoint["port"] in ports, endpoint["path"]) for endpoint in monitor["spec"]["endpoints"]] == [
        (True, "/metrics")
    ]


@pytest.fixture(scope="module")
def public_key(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("keys") / "public.pem"
    path.write_bytes(TokenMinter("RS256").public_pem())
    return str(path)


@pytest.mark.parametrize("source", ["deploy/bastion/config.toml", "the Kubernetes ConfigMap"])
def test_bastions_deployed_configuration_loads(source: str, public_key: str, tmp_path: Path) -> None:
    config = REPO / source if source.startswith("deploy/") else tmp_path / "config.toml"
    if not source.startswith("deploy/"):
        config.write_text(bastion_config())
    environ = {
        "SERVICE_TOKEN_PUBLIC_KEY_PATH": public_key,
        "SERVICE_POLICY_POLICY_PATH": str(REPO / "examples" / "documents_api" / "policies.cedar"),
    }
    settings = load_settings(config, environ=environ)
    assert settings.service.graceful_shutdown_secs == 30.0
    assert settings.rate_limit.distributed is True
    assert settings.broker is not None
    assert [stream.num_replicas for stream in settings.broker.streams.values()] == [
        1 if source.startswith("deploy/") else 3
    ]


def test_the_units_are_sandboxed_and_only_the_relay_binds_a_privileged_port() -> None:
    def options(program: str) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for line in UNITS[program].read_text().splitlines():
            if "=" in line and not line.startswith("#"):
                key, value = line.split("=", 1)
                found.setdefault(key, []).append(value)
        return found

    for program in UNITS:
        unit = options(program)
        sandbox = (unit["DynamicUser"], unit["ProtectSystem"], unit["NoNewPrivileges"], unit["KillSignal"])
        assert sandbox == (["yes"], ["strict"], ["yes"], ["SIGTERM"]), program
    assert (options("bastion")["CapabilityBoundingSet"], options("bastion")["AmbientCapabilities"]) == ([""], [""])
    relay = options("mailrelay")
    assert (relay["CapabilityBoundingSet"], relay["AmbientCapabilities"]) == (["CAP_NET_BIND_SERVICE"],) * 2
    assert relay["Environment"][0] == "MAIL_RELAY_PORT=25"


def test_the_compose_file_names_files_that_exist() -> None:
    compose_dir = DEPLOY / "compose"
    compose = yaml.safe_load((compose_dir / "compose.yaml").read_text())
    for name, service in compose["services"].items():
        if "build" in service:
            assert (compose_dir / service["build"]["context"] / service["build"]["dockerfile"]).is_file(), name
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (compose_dir / source).is_file(), (name, source)
    assert set(compose["services"]) == {"valkey", "nats", "bastion", "mailrelay", "webhook", "prometheus"}
    assert compose["services"]["mailrelay"]["environment"]["MAIL_RELAY_QUEUE"] == "jetstream"


def test_every_alert_has_a_runbook_section_in_the_deployment_docs() -> None:
    headings = re.findall(r"^### (\w+)$", (REPO / "docs" / "deployment.md").read_text(), flags=re.MULTILINE)
    alerts = [str(rule["alert"]) for rule in rules()]
    assert alerts and set(alerts) <= set(headings)
    for rule in rules():
        annotations = rule["annotations"]
        assert isinstance(annotations, dict)
        assert annotations["runbook"] == f"docs/deployment.md#{str(rule['alert']).lower()}"


@pytest.mark.parametrize("program", ["bastion", "mailrelay"])
def test_every_dashboard_panel_queries_something(program: str) -> None:
    expressions = dashboard_expressions(program)
    assert len(expressions) >= 10 and all(expression.strip() for expression in expressions)


def test_the_compose_webhook_receiver_takes_signed_posts_and_refuses_the_rest(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WEBHOOK_SECRET", "s3cret")
    spec = importlib.util.spec_from_file_location("webhook_receiver", DEPLOY / "compose" / "webhook_receiver.py")
    assert spec is not None and spec.loader is not None
    receiver = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(receiver)
    server = ThreadingHTTPServer(("127.0.0.1", 0), receiver.Receiver)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/webhook"
        body = json.dumps({"subject": "Hello"}).encode()
        timestamp = int(time.time())
        signed = {
            "X-MailRelay-Timestamp": str(timestamp),
            "X-MailRelay-Signature-256": compute_signature("s3cret", timestamp, body),
            "X-MailRelay-Delivery-Id": "d-1",
        }
        statuses = [
            httpx.post(url, content=body, headers=signed, timeout=5).status_code,
            httpx.post(
                url, content=body, headers={**signed, "X-MailRelay-Signature-256": "sha256=00"}, timeout=5
            ).status_code,
            httpx.post(url, content=body, timeout=5).status_code,
        ]
    finally:
        server.shutdown()
        server.server_close()
    assert statuses == [204, 401, 401]
    assert capsys.readouterr().out == '{"delivery_id": "d-1", "subject": "Hello"}\n'
