"""The wheels as a user gets them (``make dist-check``; docs/installation.md): ``make dist`` builds every sdist and
wheel, then each program's wheel is installed alone into a fresh virtual environment (its dependencies from the
package index, as ``pip install bastion`` would fetch them) and runs there.

- Bastion alone: none of MailRelay's packages nor the optional features' clients are installed, and a small
  secured service (token, policy, rate limit) answers 401, 200, 403 and 429 where it should.
- MailRelay alone: none of FastAPI, uvicorn, Starlette, grpclib or cedarpy are installed, and one mail becomes
  one signed webhook.

Not part of ``make test`` (the name does not match ``test_*.py``, so only naming this file collects it): the
virtual environments take a few minutes to fill. ``.ci/run`` runs ``make dist-check`` after ``make test``.
"""

from __future__ import annotations

import json
import os
import shutil
import smtplib
import subprocess
import tarfile
import time
import venv
import zipfile
from collections.abc import Iterator
from email.message import EmailMessage
from pathlib import Path

import httpx
import pytest

from bastion_core.testing import free_port
from mailrelay import verify_signature
from mailrelay.testing import WebhookReceiver

ROOT = Path(__file__).resolve().parents[2]
DIST = ROOT / "dist"
VERSION = "0.2.0"
NOT_WITH_BASTION = ("boto3", "aiosmtpd", "aiohttp", "dkimpy", "grpclib", "nats-py", "redis")
NOT_WITH_MAILRELAY = ("fastapi", "uvicorn", "starlette", "grpclib", "cedarpy")
SECRET = "dist-check-signing-secret"
STARTUP_TIMEOUT_SECS = 60.0  # a bound on waiting, not a measurement: the check is that it answers at all

APP = """
from bastion import Service

service = Service("dist-check", version="1.0.0")
v1 = service.version(1)


@v1.get("/notes")
async def list_notes() -> dict[str, list[str]]:
    return {"notes": ["first"]}


@v1.delete("/notes")
async def delete_notes() -> dict[str, bool]:
    return {"deleted": True}
"""
CONFIG = """
[token]
algorithm = "RS256"
public_key_path = "keys/jwt-public.pem"

[policy]
policy_path = "policies.cedar"

[rate_limit]
per_user_rpm = 5
"""
POLICIES = """
@id("readers-list-notes")
permit(principal is User, action == Action::"GET /api/v1/notes", resource)
when { principal.roles.contains("reader") };
"""


@pytest.fixture(scope="module")
def wheels() -> dict[str, Path]:
    """``make dist``, then each distribution's wheel."""
    shutil.rmtree(DIST, ignore_errors=True)
    subprocess.run(["make", "dist"], cwd=ROOT, check=True, capture_output=True, timeout=600)
    names = {"bastion-core": "bastion_core", "bastion": "bastion", "mailrelay": "mailrelay"}
    built = {name: DIST / f"{stem}-{VERSION}-py3-none-any.whl" for name, stem in names.items()}
    for name, stem in names.items():
        assert built[name].is_file(), sorted(path.name for path in DIST.iterdir())
        assert (DIST / f"{stem}-{VERSION}.tar.gz").is_file()
    return built


VENDORED_LICENCES = (
    "src/bastion/_docs_assets/swagger-ui/LICENSE",
    "src/bastion/_docs_assets/swagger-ui/NOTICE",
    "src/bastion/_docs_assets/swagger-ui/swagger-ui-bundle.js.LICENSE.txt",
    "src/bastion/_docs_assets/redoc/LICENSE",
    "src/bastion/_docs_assets/redoc/redoc.standalone.js.LICENSE.txt",
)


@pytest.mark.parametrize("name", ["bastion-core", "bastion", "mailrelay"])
def test_every_sdist_and_wheel_carries_the_licence(wheels: dict[str, Path], name: str) -> None:
    stem = wheels[name].name.split("-")[0]
    licences = {"LICENSE", "NOTICE", *(VENDORED_LICENCES if name == "bastion" else ())}
    with zipfile.ZipFile(wheels[name]) as wheel:
        prefix = f"{stem}-{VERSION}.dist-info/licenses/"
        assert {entry[len(prefix) :] for entry in wheel.namelist() if entry.startswith(prefix)} == licences
    with tarfile.open(DIST / f"{stem}-{VERSION}.tar.gz") as sdist:
        names = {member.name.removeprefix(f"{stem}-{VERSION}/") for member in sdist.getmembers()}
    assert licences | {"CHANGELOG.md", "README.md", "pyproject.toml"} <= names


def fresh_venv(directory: Path, *wheels: Path) -> Path:
    """A new virtual environment with ``wheels`` installed (their dependencies from the index); its bin/."""
    venv.EnvBuilder(with_pip=True, clear=True).create(directory)
    python = directory / "bin" / "python"
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *map(str, wheels)],
        check=True,
        capture_output=True,
        timeout=900,
    )
    return directory / "bin"


def installed(bin_dir: Path) -> set[str]:
    result = subprocess.run(
        [bin_dir / "python", "-m", "pip", "list", "--format=json", "--disable-pip-version-check"],
        check=True,
        capture_output=True,
        text=True,
    )
    return {package["name"].lower() for package in json.loads(result.stdout)}


def clean_env(bin_dir: Path) -> dict[str, str]:
    """The environment of a user's shell in that venv: none of the development checkout's paths or settings."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("SERVICE_", "MAIL_RELAY_", "BASTION_", "PYTHON", "VIRTUAL_ENV"))
    }
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return env


def wait_for(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_SECS
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} did not answer: {log.read_text()}")


@pytest.fixture
def stopped_at_exit() -> Iterator[list[subprocess.Popen[bytes]]]:
    processes: list[subprocess.Popen[bytes]] = []
    yield processes
    for process in processes:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_the_bastion_wheel_alone_serves_a_secured_service(
    wheels: dict[str, Path], tmp_path: Path, stopped_at_exit: list[subprocess.Popen[bytes]]
) -> None:
    bin_dir = fresh_venv(tmp_path / "venv", wheels["bastion"], wheels["bastion-core"])
    packages = installed(bin_dir)
    assert {"bastion", "bastion-core", "fastapi", "uvicorn", "cedarpy"} <= packages
    assert packages.isdisjoint(NOT_WITH_BASTION), sorted(packages & set(NOT_WITH_BASTION))

    app_dir = tmp_path / "service"
    app_dir.mkdir()
    (app_dir / "notes_app.py").write_text(APP)
    (app_dir / "service.toml").write_text(CONFIG)
    (app_dir / "policies.cedar").write_text(POLICIES)
    env = clean_env(bin_dir)
    bastion = str(bin_dir / "bastion")
    subprocess.run([bastion, "dev-keys", "--dir", "keys"], cwd=app_dir, env=env, check=True, capture_output=True)
    minted = subprocess.run(
        [bastion, "dev-token", "--key", "keys/jwt-private.pem", "--sub", "alice", "--roles", "reader"],
        cwd=app_dir,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    auth = {"Authorization": f"Bearer {minted.stdout.strip()}"}
    manual = subprocess.run([bastion, "docs", "installation"], env=env, check=True, capture_output=True, text=True)
    assert manual.stdout.startswith("# Installation\n")  # the copy in the bastion-core wheel
    port = free_port()
    log = tmp_path / "bastion.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [
                bastion,
                "run",
                "notes_app:service",
                "--config",
                "service.toml",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            cwd=app_dir,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    stopped_at_exit.append(process)
    base = f"http://127.0.0.1:{port}"
    wait_for(f"{base}/health", process, log)

    with httpx.Client(base_url=base, timeout=10.0) as client:
        assert client.get("/api/v1/notes").status_code == 401  # not charged: the limiter runs after auth
        assert client.get("/api/v1/notes", headers=auth).json() == {"notes": ["first"]}  # 1 of 5
        denied = client.delete("/api/v1/notes", headers=auth)  # 2 of 5: the policy permits only GET
        assert (denied.status_code, denied.json()["code"]) == (403, "FORBIDDEN")
        assert [client.get("/api/v1/notes", headers=auth).status_code for _ in range(3)] == [200, 200, 200]
        limited = client.get("/api/v1/notes", headers=auth)  # 6 of 5
        assert (limited.status_code, limited.json()["code"]) == (429, "RATE_LIMIT_EXCEEDED")


def test_the_mailrelay_wheel_alone_delivers_a_signed_webhook(
    wheels: dict[str, Path], tmp_path: Path, stopped_at_exit: list[subprocess.Popen[bytes]]
) -> None:
    bin_dir = fresh_venv(tmp_path / "venv", wheels["mailrelay"], wheels["bastion-core"])
    packages = installed(bin_dir)
    assert {"mailrelay", "bastion-core", "aiosmtpd", "aiohttp"} <= packages
    assert packages.isdisjoint(NOT_WITH_MAILRELAY), sorted(packages & set(NOT_WITH_MAILRELAY))

    smtp_port, health_port = free_port(), free_port()
    workdir = tmp_path / "relay"
    workdir.mkdir()
    with WebhookReceiver() as receiver:
        env = {
            **clean_env(bin_dir),
            "MAIL_RELAY_TARGET_EMAILS": "inbox@example.test",
            "MAIL_RELAY_WEBHOOK_URL": receiver.url,
            "MAIL_RELAY_WEBHOOK_SIGNING_SECRET": SECRET,
            "MAIL_RELAY_BIND_ADDRESS": "127.0.0.1",
            "MAIL_RELAY_PORT": str(smtp_port),
            "MAIL_RELAY_HEALTH_BIND_ADDRESS": "127.0.0.1",
            "MAIL_RELAY_HEALTH_PORT": str(health_port),
        }
        log = tmp_path / "mailrelay.log"
        with log.open("wb") as output:
            process = subprocess.Popen(
                [str(bin_dir / "mailrelay")], cwd=workdir, env=env, stdout=output, stderr=subprocess.STDOUT
            )
        stopped_at_exit.append(process)
        wait_for(f"http://127.0.0.1:{health_port}/health", process, log)

        message = EmailMessage()
        message["From"] = "sender@example.org"
        message["To"] = "inbox@example.test"
        message["Subject"] = "From the wheel"
        message.set_content("Delivered by the mailrelay wheel alone.")
        with smtplib.SMTP("127.0.0.1", smtp_port, timeout=30) as smtp:
            refused = smtp.send_message(message)
        assert refused == {}

        [request] = receiver.wait_for(1, timeout=30)
    assert verify_signature(
        SECRET,
        timestamp=request.header("X-MailRelay-Timestamp") or "",
        signature=request.header("X-MailRelay-Signature-256") or "",
        body=request.body,
        now=time.time(),
    )
    payload = json.loads(request.body)
    assert payload["subject"] == "From the wheel"
    assert request.header("User-Agent") == f"MailRelay/{VERSION}"
