"""A configured feature whose extra is not installed stops start-up with one line naming the extra (exit 2), and
both programs import and serve without any extra (docs/installation.md).

Each case runs the real command in a subprocess from which the extra's packages are removed: ``blocker/`` on
``PYTHONPATH`` holds a ``sitecustomize`` that makes those imports fail as if the packages were not installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BLOCKER = Path(__file__).parent / "blocker"
EXIT_CONFIG = 2

BASTION_EXTRAS = {
    "grpc": ("grpclib,h2,hpack,hyperframe,google.protobuf", "[grpc]\nenabled = true\n", "[grpc]"),
    "broker": ("nats", '[broker]\nurl = "nats://127.0.0.1:4222"\n', "[broker]"),
    "redis": ("redis", '[cache_store]\nurl = "redis://127.0.0.1:6379/0"\n', "[cache_store] url"),
    "tracing": (
        "opentelemetry.sdk,opentelemetry.exporter",
        '[tracing]\nendpoint = "http://127.0.0.1:4318/v1/traces"\n',
        "[tracing]",
    ),
}
MAILRELAY_EXTRAS = {
    "s3": (
        "boto3,botocore",
        {"MAIL_RELAY_ATTACHMENT_DELIVERY": "s3", "MAIL_RELAY_S3_BUCKET": "mail"},
        "MAIL_RELAY_ATTACHMENT_DELIVERY=s3",
    ),
    "dmarc": ("dkim,spf,dns,publicsuffixlist", {"MAIL_RELAY_DMARC_MODE": "monitor"}, "MAIL_RELAY_DMARC_MODE"),
    "queue": (
        "nats",
        {"MAIL_RELAY_QUEUE": "jetstream", "MAIL_RELAY_NATS_URL": "nats://127.0.0.1:4222"},
        "MAIL_RELAY_QUEUE=jetstream",
    ),
    # cedarpy is Bastion's own dependency, optional only for MailRelay (its sender rules)
    "policy": ("cedarpy", {"MAIL_RELAY_SENDER_POLICY_FILE": str(ROOT / "README.md")}, "MAIL_RELAY_SENDER_POLICY_FILE"),
}
EVERY_OPTIONAL = ",".join(
    [
        *(blocked for blocked, _, _ in BASTION_EXTRAS.values()),
        *(blocked for extra, (blocked, _, _) in MAILRELAY_EXTRAS.items() if extra != "policy"),
    ]
)


def _run(
    argv: list[str], *, blocked: str, env: dict[str, str] | None = None, cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    environment = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("SERVICE_", "MAIL_RELAY_", "BASTION_"))
    }
    environment.update(env or {})
    environment["PYTHONPATH"] = os.pathsep.join([str(BLOCKER), str(ROOT)])
    environment["BLOCKED_IMPORTS"] = blocked
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=environment, cwd=cwd)


@pytest.mark.parametrize("extra", sorted(BASTION_EXTRAS))
@pytest.mark.parametrize("command", ["run", "check-config"])
def test_a_bastion_feature_without_its_extra_stops_start_up_with_one_line(
    extra: str, command: str, tmp_path: Path
) -> None:
    blocked, section, feature = BASTION_EXTRAS[extra]
    config = tmp_path / "service.toml"
    config.write_text("[token]\nenabled = false\n\n" + section)
    app = ["examples.readme_service.app:service", "--config", str(config), "--port", "0"] if command == "run" else []
    argv = [sys.executable, "-m", "bastion", command, *app, *([] if app else [str(config)])]
    result = _run(argv, blocked=blocked)
    assert (result.returncode, result.stdout, result.stderr) == (
        EXIT_CONFIG,
        "",
        f"error: {feature} needs the {extra} extra: pip install 'bastion[{extra}]'\n",
    )


@pytest.mark.parametrize("extra", sorted(MAILRELAY_EXTRAS))
def test_a_mailrelay_feature_without_its_extra_stops_start_up_with_one_line(extra: str, tmp_path: Path) -> None:
    blocked, variables, feature = MAILRELAY_EXTRAS[extra]
    env = {
        "MAIL_RELAY_TARGET_EMAILS": "inbox@example.test",
        "MAIL_RELAY_WEBHOOK_URL": "http://127.0.0.1:9/webhook",
        "MAIL_RELAY_WEBHOOK_ALLOW_INSECURE": "true",
        **variables,
    }
    result = _run([sys.executable, "-m", "mailrelay"], blocked=blocked, env=env, cwd=tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (
        EXIT_CONFIG,
        "",
        f"mailrelay: configuration error: {feature} needs the {extra} extra: pip install 'mailrelay[{extra}]'\n",
    )


@pytest.mark.parametrize(
    ("argv", "variables", "feature"),
    [
        (
            [],
            {"MAIL_RELAY_RAW": "s3", "MAIL_RELAY_S3_BUCKET": "mail"},
            "MAIL_RELAY_RAW=s3 needs the s3 extra: pip install 'mailrelay[s3]'",
        ),
        (
            ["dead-letters", "list"],
            {"MAIL_RELAY_NATS_URL": "nats://127.0.0.1:4222"},
            "mailrelay dead-letters needs the queue extra: pip install 'mailrelay[queue]'",
        ),
    ],
    ids=["raw-s3", "dead-letters"],
)
def test_the_other_users_of_an_extra_name_it_in_one_line(
    argv: list[str], variables: dict[str, str], feature: str, tmp_path: Path
) -> None:
    env = {
        "MAIL_RELAY_TARGET_EMAILS": "inbox@example.test",
        "MAIL_RELAY_WEBHOOK_URL": "http://127.0.0.1:9/webhook",
        "MAIL_RELAY_WEBHOOK_ALLOW_INSECURE": "true",
        **variables,
    }
    result = _run([sys.executable, "-m", "mailrelay", *argv], blocked="boto3,botocore,nats", env=env, cwd=tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (
        EXIT_CONFIG,
        "",
        f"mailrelay: configuration error: {feature}\n",
    )


def test_naming_the_broker_class_without_the_broker_extra_says_which_extra() -> None:
    result = _run([sys.executable, "-c", "from bastion.broker import Broker"], blocked="nats")
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == (
        "bastion_core._extras.MissingExtra: [broker] needs the broker extra: pip install 'bastion[broker]'"
    )


PROBE = """
import sys
import bastion, bastion._cli, bastion.broker, bastion.testing, mailrelay, mailrelay.cli, mailrelay.testing
from bastion.testing import ServiceClient
from examples.readme_service.app import service

with ServiceClient(service, config="examples/readme_service/service.toml") as client:
    reader = client.as_user("alice", roles=["reader"]).get("/api/v2/documents").status_code
    other = client.as_user("bob", roles=["user"]).get("/api/v2/documents").status_code
print(f"statuses {reader} {other}")
"""


def test_both_programs_import_and_serve_without_any_extra() -> None:
    """The default configuration needs none of the extras' packages (the wheels' test, tests/dist, installs them
    for real; this one removes them from the development environment)."""
    result = _run([sys.executable, "-c", PROBE], blocked=EVERY_OPTIONAL)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "statuses 200 403"


MEMORY_BROKER_PROBE = """
from bastion import Service
from bastion.broker import BrokerMessage
from bastion.testing import ServiceClient

service = Service("shop")
service.version(1)
service.stream("ORDERS", subjects=["orders.>"])
seen = []


@service.consume("orders.placed", durable="billing")
async def bill(order: dict, message: BrokerMessage) -> None:
    seen.append(message.deliveries)


with ServiceClient(service, environ={"SERVICE_TOKEN_ENABLED": "false"}) as client:
    client.broker.publish("orders.placed", {"id": "o-1"})
    published = client.broker.published("orders.>")
print("deliveries", seen, len(published))
"""


MAILRELAY_PROBE = """
import sys
import mailrelay, mailrelay.cli, mailrelay.testing
from mailrelay import _assembly, _relay
print("cedarpy" in sys.modules)
"""


def test_mailrelay_imports_without_cedarpy() -> None:
    """Only a configured sender policy imports Cedar (mailrelay[policy])."""
    result = _run([sys.executable, "-c", MAILRELAY_PROBE], blocked="cedarpy")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "False"


def test_the_in_memory_test_broker_needs_no_broker_extra() -> None:
    result = _run([sys.executable, "-c", MEMORY_BROKER_PROBE], blocked="nats")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "deliveries [1] 1"
