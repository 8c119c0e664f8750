"""The ``bastion`` command: check-config and run's start-up errors."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bastion._cli import main
from bastion.policy import load_policies
from bastion.testing import TokenMinter
from tests.conftest import BASTION, REPO

EXAMPLE_CONFIG = REPO / "examples" / "documents_api" / "config.toml"
TOKEN_OFF_OPEN = {"SERVICE_TOKEN_ENABLED": "false", "SERVICE_POLICY_ENABLED": "false", "SERVICE_LOG_LEVEL": "info"}


@pytest.fixture(autouse=True)
def _environment_restored() -> Iterator[None]:
    """``bastion run`` / ``check-config`` put ``.env`` and ``--log-level`` into ``os.environ``: undo it after
    each in-process call."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def example_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The example's config reads ``.dev/jwt-public.pem`` (made by ``make run``); tests point it at a fresh key."""
    path = tmp_path / "public.pem"
    path.write_bytes(TokenMinter("RS256").public_pem())
    monkeypatch.setenv("SERVICE_TOKEN_PUBLIC_KEY_PATH", str(path))
    return path


def test_check_config_accepts_the_example(example_key: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(EXAMPLE_CONFIG)]) == 0
    out, err = capsys.readouterr()
    assert "configuration OK" in err
    effective = json.loads(out)
    assert effective["service"]["name"] == "documents-api"
    assert effective["service"]["port"] == 8080


def test_check_config_masks_secrets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[token]\nalgorithm = "HS256"\nsecret = "do-not-print-do-not-print-do-not-print"\n')
    assert main(["check-config", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "do-not-print" not in out + err
    assert json.loads(out)["token"]["secret"] == "***"


def test_check_config_names_the_broken_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "broken.toml"
    path.write_text('[rate_limit]\nper_user_rpm = "lots"\n')
    assert main(["check-config", str(path)]) == 2
    _, err = capsys.readouterr()
    assert "rate_limit.per_user_rpm = 'lots'" in err


def test_check_config_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(tmp_path / "absent.toml")]) == 2
    assert "config file not found" in capsys.readouterr().err


@pytest.fixture
def broken_configs(tmp_path: Path) -> Path:
    (tmp_path / "bad.pem").write_text("not a key")
    (tmp_path / "badkey.toml").write_text('[token]\nalgorithm = "RS256"\npublic_key_path = "bad.pem"\n')
    (tmp_path / "nokey.toml").write_text('[token]\nalgorithm = "RS256"\npublic_key_path = "missing.pem"\n')
    (tmp_path / "folder.toml").mkdir()
    return tmp_path


@pytest.mark.parametrize(
    ("args", "line"),
    [
        pytest.param(
            ["examples.documents_api"],
            "error: app 'examples.documents_api' must have the form MODULE:ATTR, e.g. examples.documents_api:service",
            id="no-attr",
        ),
        pytest.param(
            ["no_such_module:service"], f"error: cannot import module 'no_such_module' (from {REPO})", id="no-module"
        ),
        pytest.param(
            ["examples.documents_api:nothing"],
            "error: module 'examples.documents_api' has no attribute 'nothing'",
            id="no-attribute",
        ),
        pytest.param(
            ["examples.documents_api:store"],
            "error: 'examples.documents_api:store' is a DocumentStore, not a bastion.Service",
            id="not-a-service",
        ),
        pytest.param(
            ["examples.documents_api:service", "--port", "99999"],
            "error: --port 99999 is not a TCP port (0-65535)",
            id="bad-port",
        ),
        pytest.param(
            ["examples.documents_api:service", "--config", "/nonexistent.toml"],
            "error: config file not found: /nonexistent.toml",
            id="no-config",
        ),
        pytest.param(
            ["examples.documents_api:service", "--config", "{tmp}/folder.toml"],
            "error: cannot read config file {tmp}/folder.toml: Is a directory",
            id="unreadable-config",
        ),
        pytest.param(
            ["examples.documents_api:service", "--config", "{tmp}/nokey.toml"],
            "error: token.public_key_path = '{tmp}/missing.pem': cannot read the file (no such file)",
            id="missing-key-file",
        ),
    ],
)
def test_run_start_up_errors_exit_2_before_listening(args: list[str], line: str, broken_configs: Path) -> None:
    argv = [arg.format(tmp=broken_configs) for arg in args]
    result = subprocess.run([BASTION, "run", *argv], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr == line.format(tmp=broken_configs) + "\n"


def test_a_key_file_that_is_not_a_key_is_one_line(broken_configs: Path) -> None:
    config = broken_configs / "badkey.toml"
    result = subprocess.run(
        [BASTION, "run", "examples.documents_api:service", "--config", str(config)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    # the cryptography library's reason follows in parentheses; the line names the key, the file and the algorithm
    assert result.stderr.startswith(
        f"error: token.public_key_path = '{broken_configs}/bad.pem': not a PEM public key for RS256 ("
    )
    assert result.stderr.count("\n") == 1


def test_run_with_bad_env_value_names_the_variable() -> None:

    result = subprocess.run(
        [BASTION, "run", "examples.documents_api:service"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SERVICE_PORT": "http"},
    )
    assert result.returncode == 2
    assert "SERVICE_PORT='http' (service.port)" in result.stderr


def test_dev_keys_then_dev_token_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import asyncio

    from bastion.auth._jwt import JwtVerifier
    from bastion.config import TokenSettings

    assert main(["dev-keys", "--dir", str(tmp_path)]) == 0
    first = (tmp_path / "jwt-private.pem").read_bytes()
    assert main(["dev-keys", "--dir", str(tmp_path)]) == 0
    assert (tmp_path / "jwt-private.pem").read_bytes() == first, "dev-keys keeps an existing pair"
    capsys.readouterr()
    args = ["dev-token", "--key", str(tmp_path / "jwt-private.pem"), "--sub", "carol", "--roles", "user", "admin"]
    assert main([*args, "--claim", "tenant=7", "--email", "c@x.io"]) == 0
    token = capsys.readouterr().out.strip()
    verifier = JwtVerifier(TokenSettings(algorithm="RS256", public_key_path=str(tmp_path / "jwt-public.pem")))
    claims = asyncio.run(verifier.decode(token))
    assert (claims.sub, claims.roles, claims.email, claims.extra["tenant"]) == ("carol", ("user", "admin"), "c@x.io", 7)


def test_dev_token_with_a_bad_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "junk.pem"
    path.write_text("nope")
    assert main(["dev-token", "--key", str(path)]) == 2
    assert "not an RSA or EC private key" in capsys.readouterr().err
    assert main(["dev-token", "--key", str(tmp_path / "absent.pem")]) == 2


class TestPolicyCommands:
    POLICIES = REPO / "examples" / "documents_api" / "policies.cedar"

    def test_check_ok(self, capsys: pytest.CaptureFixture[str]) -> None:
        assert main(["policy", "check", str(self.POLICIES)]) == 0
        assert "6 policies OK" in capsys.readouterr().out

    def test_check_names_statement_and_line(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        path = tmp_path / "bad.cedar"
        path.write_text("permit(principal, action, resource);\n\nforbid(principal, actoin, resource);\n")
        assert main(["policy", "check", str(path)]) == 2
        assert "statement 2 (line 3)" in capsys.readouterr().err

    def test_eval_allow_with_reason(self, capsys: pytest.CaptureFixture[str]) -> None:
        code = main(
            [
                "policy",
                "eval",
                str(self.POLICIES),
                "--principal",
                '{"sub": "alice", "roles": ["user"]}',
                "--action",
                "GET /api/v1/documents/{user_id}/{doc_id}",
                "--resource",
                '{"owner_id": "alice"}',
            ]
        )
        assert code == 0
        assert capsys.readouterr().out.splitlines() == ["ALLOW", "  reason: documents-owner"]

    def test_eval_deny_exits_1(self, capsys: pytest.CaptureFixture[str]) -> None:
        code = main(
            [
                "policy",
                "eval",
                str(self.POLICIES),
                "--principal",
                '{"sub":"a","roles":["user"]}',
                "--action",
                "GET /api/v2/admin/users",
            ]
        )
        assert code == 1
        assert capsys.readouterr().out.splitlines() == ["DENY", "  reason: admin-users-admins-only"]

    def test_eval_error(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        path = tmp_path / "p.cedar"
        path.write_text("permit(principal, action, resource) when { resource.level > 3 };")
        assert main(["policy", "eval", str(path), "--action", "GET /x"]) == 1
        out = capsys.readouterr().out
        assert out.startswith("ERROR") and "level" in out

    def test_eval_takes_method_path_and_version_from_the_action(self, capsys: pytest.CaptureFixture[str]) -> None:
        principal = '{"sub": "alice", "roles": ["user"]}'
        action = "GET /api/v2/documents"
        assert main(["policy", "eval", str(self.POLICIES), "--principal", principal, "--action", action]) == 0
        assert capsys.readouterr().out.splitlines() == ["ALLOW", "  reason: documents-list-create"]

    def test_eval_error_names_the_statement_and_id(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        path = tmp_path / "p.cedar"
        path.write_text(
            'permit(principal, action, resource);\n\n@id("levels")\n'
            "forbid(principal, action, resource) when { resource.level > 3 };"
        )
        assert main(["policy", "eval", str(path), "--action", "GET /x"]) == 1
        assert capsys.readouterr().out.splitlines() == [
            "ERROR",
            "  reason: policy0",
            '  error: error while evaluating statement 2 (line 3), @id("levels"): `Resource::"resource"` does not '
            "have the attribute `level`",
        ]

    def test_check_against_the_app(self, capsys: pytest.CaptureFixture[str]) -> None:
        app = ["--app", "examples.documents_api:service", "--config", str(REPO / "examples/documents_api/config.toml")]
        assert main(["policy", "check", str(self.POLICIES), *app]) == 0
        assert capsys.readouterr().out == (
            f"{self.POLICIES}: 6 policies OK (digest {load_policies(self.POLICIES).digest}; context attributes read: "
            "method, path, version; valid against the schema of examples.documents_api:service, 29 actions)\n"
        )

    def test_check_against_the_app_names_file_line_and_id(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        path = tmp_path / "p.cedar"
        path.write_text(
            '// readers\n@id("readers")\npermit(principal, action, resource)\nwhen { principal.role.contains("r") };\n'
            '@id("nope")\npermit(principal, action == Action::"GET /api/v2/nope", resource);\n'
        )
        assert main(["policy", "check", str(path), "--app", "examples.documents_api:service"]) == 2
        captured = capsys.readouterr()
        problem = f"error: policy file {str(path)!r} does not validate against the service's schema: "
        assert (captured.out, captured.err.splitlines()) == (
            "",
            [
                problem + 'statement 1 (line 2), @id("readers"): attribute `role` on entity type `User` not found; '
                "did you mean `roles`?",
                problem + 'statement 2 (line 5), @id("nope"): unrecognized action `Action::"GET /api/v2/nope"`',
            ],
        )

    def test_check_config_needs_an_app(self, capsys: pytest.CaptureFixture[str]) -> None:
        assert main(["policy", "check", str(self.POLICIES), "--config", "x.toml"]) == 2
        assert capsys.readouterr().err == (
            "error: policy check --config names the configuration of --app MODULE:ATTR: give both\n"
        )

    def test_check_with_an_app_that_does_not_import(self, capsys: pytest.CaptureFixture[str]) -> None:
        assert main(["policy", "check", str(self.POLICIES), "--app", "examples.nowhere:service"]) == 2
        assert capsys.readouterr().err.startswith("error: cannot import module 'examples.nowhere'")

    def test_schema_prints_the_cedar_schema(self, capsys: pytest.CaptureFixture[str]) -> None:
        assert main(["policy", "schema", "examples.documents_api:service"]) == 0
        schema = json.loads(capsys.readouterr().out)[""]
        assert sorted(schema["actions"]) == [
            "/documents.v1.DocumentService/GetDocument",
            "/documents.v1.DocumentService/ListDocuments",
            "/documents.v1.DocumentService/WatchDocuments",
            "DELETE /api/v1/documents/{user_id}/{doc_id}",
            "DELETE /api/v2/documents/{user_id}/{doc_id}",
            "GET /api/v1/admin/users",
            "GET /api/v1/docs",
            "GET /api/v1/documents",
            "GET /api/v1/documents/{user_id}/{doc_id}",
            "GET /api/v1/openapi.json",
            "GET /api/v1/redoc",
            "GET /api/v2/admin/users",
            "GET /api/v2/docs",
            "GET /api/v2/documents",
            "GET /api/v2/documents/{user_id}/{doc_id}",
            "GET /api/v2/openapi.json",
            "GET /api/v2/redoc",
            "HEAD /api/v1/docs",
            "HEAD /api/v1/openapi.json",
            "HEAD /api/v1/redoc",
            "HEAD /api/v2/docs",
            "HEAD /api/v2/openapi.json",
            "HEAD /api/v2/redoc",
            "POST /admin/reload-policy",
            "POST /admin/revoke-token",
            "POST /api/v1/documents",
            "POST /api/v2/documents",
            "PUT /api/v1/documents/{user_id}/{doc_id}",
            "PUT /api/v2/documents/{user_id}/{doc_id}",
        ]
        assert schema["entityTypes"]["Resource"]["shape"]["attributes"] == {
            "doc_id": {"type": "String", "required": False},
            "owner_id": {"type": "String", "required": False},
            "user_id": {"type": "String", "required": False},
        }

    def test_eval_rejects_non_json(self, capsys: pytest.CaptureFixture[str]) -> None:
        with pytest.raises(SystemExit) as info:
            main(["policy", "eval", str(self.POLICIES), "--action", "GET /x", "--principal", "{nope"])
        assert info.value.code == 2
        assert "not JSON" in capsys.readouterr().err


APPS = {
    "broken_syntax.py": "from bastion import Service\n\nservice = Service('x') +\n",
    "needs_missing.py": "import not_installed_pkg_xyz\n",
    "raises_at_import.py": "raise RuntimeError('kaboom')\n",
    "name_error.py": "from bastion import Service\n\nservice = Service(undefined_name)\n",
    "router_app.py": "from bastion import Service\nservice = Service('r')\nv2 = service.version(2)\n",
}


@pytest.fixture
def apps(tmp_path: Path) -> Path:
    for name, source in APPS.items():
        (tmp_path / name).write_text(source)
    return tmp_path


def bastion(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import sys

    return subprocess.run(
        [sys.executable, "-m", "bastion", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize(
    ("app", "line"),
    [
        pytest.param(
            "broken_syntax:service",
            "error: importing 'broken_syntax' failed: {dir}/broken_syntax.py:3: SyntaxError: invalid syntax",
            id="syntax-error",
        ),
        pytest.param(
            "needs_missing:service",
            "error: importing 'needs_missing' failed: No module named 'not_installed_pkg_xyz' "
            "(is it installed in this environment?)",
            id="missing-dependency",
        ),
        pytest.param(
            "raises_at_import:service",
            "error: importing 'raises_at_import' failed: {dir}/raises_at_import.py:1: RuntimeError: kaboom",
            id="exception-at-import",
        ),
        pytest.param(
            "name_error:service",
            "error: importing 'name_error' failed: {dir}/name_error.py:3: NameError: name 'undefined_name' is not "
            "defined",
            id="name-error-with-file-and-line",
        ),
        pytest.param(
            "router_app:v2",
            "error: 'router_app:v2' is a router (ApiVersion), not a bastion.Service: point at the Service its "
            "routes belong to, e.g. MODULE:service",
            id="a-router",
        ),
        pytest.param(
            "router_app.py:service",
            "error: app 'router_app.py:service': name the module, not the file: router_app:service",
            id="file-name",
        ),
    ],
)
def test_an_app_that_cannot_be_served_is_one_error_line_and_exit_2(apps: Path, app: str, line: str) -> None:
    result = bastion("run", app, "--app-dir", str(apps))
    assert (result.returncode, result.stderr.splitlines()[-1]) == (2, line.format(dir=apps))
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("how", [["--debug"], []], ids=["flag", "variable"])
def test_debug_shows_the_traceback_as_well(apps: Path, how: list[str]) -> None:
    env = {} if how else {"BASTION_DEBUG": "1"}
    result = bastion(*how, "run", "raises_at_import:service", "--app-dir", str(apps), env=env)
    assert result.returncode == 2
    assert "Traceback (most recent call last)" in result.stderr and "RuntimeError: kaboom" in result.stderr
    assert result.stderr.splitlines()[-1] == (
        f"error: importing 'raises_at_import' failed: {apps}/raises_at_import.py:1: RuntimeError: kaboom"
    )


def test_version_and_python_dash_m() -> None:
    from importlib import metadata

    result = bastion("--version")
    assert (result.returncode, result.stdout) == (0, f"bastion {metadata.version('bastion')}\n")


def test_a_misspelled_command_gets_a_suggestion() -> None:
    result = bastion("rnu", "examples.documents_api:service")
    assert (result.returncode, result.stderr) == (2, "error: unknown command 'rnu'; did you mean 'run'?\n")
    result = bastion("frobnicate")
    assert result.stderr == (
        "error: unknown command 'frobnicate' (commands: run, check-config, policy, deprecations, dev-keys, "
        "dev-ca, dev-token, docs)\n"
    )


def test_docs_lists_the_installed_documentation_and_prints_a_page(capsys: pytest.CaptureFixture[str]) -> None:
    """A source checkout reads docs/ (a wheel carries the same files as bastion_core/_docs; tests/dist checks it)."""
    assert main(["docs"]) == 0
    listing = capsys.readouterr().out.splitlines()
    assert listing[0] == f"The documentation of this release, installed in {REPO / 'docs'}:"
    assert "  installation    Installation" in listing
    assert listing[-1] == "`bastion docs TOPIC` prints one (Markdown)."
    assert main(["docs", "installation"]) == 0
    assert capsys.readouterr().out == (REPO / "docs" / "installation.md").read_text()


def test_docs_of_an_unknown_topic_suggests_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["docs", "instalation"]) == 2
    assert capsys.readouterr().err == "error: no documentation topic 'instalation'; did you mean 'installation'?\n"


def test_dev_token_with_the_public_key_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "public.pem"
    path.write_bytes(TokenMinter("RS256").public_pem())
    assert main(["dev-token", "--key", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"error: --key {str(path)!r} is not an RSA or EC private key (that is a public key: dev-token signs with "
        "the private one)"
    )
    assert len(err.splitlines()) == 1


def test_log_level_flag_overrides_the_configuration(bastion_process: Callable[..., Any]) -> None:
    """``--log-level warning`` silences the info lines the example's config (log_level info) would print."""
    quiet = bastion_process("examples.documents_api:service", "--log-level", "WARNING", env=TOKEN_OFF_OPEN)
    loud = bastion_process("examples.documents_api:service", env=TOKEN_OFF_OPEN)
    loud.wait_for_output("service_started")
    assert "service_started" not in quiet.output() and "security_posture" not in quiet.output()


def check_config_in(folder: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import sys

    clean = {name: value for name, value in os.environ.items() if not name.startswith("SERVICE_")}
    return subprocess.run(
        [sys.executable, "-m", "bastion", "check-config", "service.toml"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=60,
        env={**clean, "PYTHONPATH": str(REPO / "src"), "SERVICE_TOKEN_ENABLED": "false", **(env or {})},
    )


def test_dotenv_sits_between_the_environment_and_the_file(tmp_path: Path) -> None:
    (tmp_path / "service.toml").write_text('[service]\nname = "from-file"\nport = 9000\nversion = "9.9.9"\n')
    (tmp_path / ".env").write_text(
        "# local overrides\nSERVICE_PORT=9100\nexport SERVICE_NAME='from-dotenv'\nOTHER_TOOL=ignored\n"
    )
    result = check_config_in(tmp_path, {"SERVICE_NAME": "from-env"})
    assert result.returncode == 0, result.stderr
    effective = json.loads(result.stdout)["service"]
    assert (effective["name"], effective["port"], effective["version"], effective["host"]) == (
        "from-env",  # environment over .env
        9100,  # .env over the file
        "9.9.9",  # the file over the defaults
        "0.0.0.0",  # the default
    )


def test_a_malformed_dotenv_line_is_named(tmp_path: Path) -> None:
    (tmp_path / "service.toml").write_text("")
    (tmp_path / ".env").write_text("SERVICE_PORT=9100\nthis is not a setting\n")
    result = check_config_in(tmp_path)
    assert (result.returncode, result.stderr) == (
        2,
        "error: .env line 2: expected NAME=value, got 'this is not a setting'\n",
    )


def test_an_unknown_key_close_to_a_real_one_gets_a_suggestion(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[token]\nenabled = false\nalgoritm = "RS256"\n[servce]\nport = 1\n[rate_limit]\nzzz = 1\n')
    assert main(["check-config", str(path)]) == 2
    assert capsys.readouterr().err == (
        f"error: invalid configuration ({path}): unknown key 'token.algoritm'; did you mean 'token.algorithm'?; "
        "unknown key 'rate_limit.zzz'; unknown key 'servce'; did you mean 'service'?\n"
    )


def test_a_factory_function_or_partial_is_called_for_the_service(tmp_path: Path) -> None:
    from bastion._runner import import_service

    (tmp_path / "factories.py").write_text(
        "import functools\nfrom bastion import Service\n"
        "def make(name='made'):\n    service = Service(name)\n    service.version(1)\n    return service\n"
        "partial = functools.partial(make, 'partial')\n"
    )
    assert import_service("factories:make", app_dir=str(tmp_path)).name == "made"
    assert import_service("factories:partial", app_dir=str(tmp_path)).name == "partial"


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param([BASTION, "policy", "schema", "examples.documents_api:service"], id="bastion policy schema"),
        pytest.param([BASTION, "docs", "configuration"], id="bastion docs"),
        pytest.param([str(Path(BASTION).with_name("mailrelay")), "docs"], id="mailrelay docs"),
        pytest.param([str(Path(BASTION).with_name("mailrelay")), "--help"], id="mailrelay --help"),
    ],
)
def test_a_closed_output_pipe_ends_quietly(argv: list[str]) -> None:
    """``bastion policy schema ... | head``: the reader has left before the output is written; no traceback, the
    exit status a tool killed by SIGPIPE has (141)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run(argv, cwd=REPO, stdout=write_end, stderr=subprocess.PIPE, timeout=60, check=False)
    finally:
        os.close(write_end)
    assert (result.returncode, result.stderr) == (141, b"")


class TestCheckConfigWithTheApp:
    """``check-config FILE --app MODULE:ATTR`` runs what ``bastion run`` checks once the app is built."""

    APP = ["--app", "examples.documents_api:service"]

    @staticmethod
    def config(folder: Path, policy: str) -> Path:
        (folder / "policies.cedar").write_text(policy)
        path = folder / "service.toml"
        path.write_text('[token]\nenabled = false\n\n[policy]\npolicy_path = "policies.cedar"\n')
        return path

    def test_a_policy_invalid_against_the_schema_is_one_error_line(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        path = self.config(
            tmp_path, '@id("nope")\npermit(principal, action == Action::"GET /api/v2/nope", resource);\n'
        )
        assert main(["check-config", str(path), *self.APP]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err.splitlines() == [
            f"error: policy.policy_path = {str(tmp_path / 'policies.cedar')!r} does not validate against the service's "
            "schema: "
            'statement 1 (line 1), @id("nope"): unrecognized action `Action::"GET /api/v2/nope"`'
        ]

    def test_a_valid_policy_passes_with_the_app(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        path = self.config(
            tmp_path, '@id("reads")\npermit(principal, action == Action::"GET /api/v1/documents", resource);\n'
        )
        assert main(["check-config", str(path), *self.APP]) == 0
        captured = capsys.readouterr()
        assert captured.err.splitlines()[0] == f"configuration OK with examples.documents_api:service: {path}"
        assert json.loads(captured.out)["policy"]["policy_path"] == str(tmp_path / "policies.cedar")

    def test_without_the_app_it_says_what_it_did_not_check(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        path = self.config(
            tmp_path, '@id("nope")\npermit(principal, action == Action::"GET /api/v2/nope", resource);\n'
        )
        assert main(["check-config", str(path)]) == 0
        assert capsys.readouterr().err.splitlines()[0] == (
            f"configuration OK: {path} (not checked without --app MODULE:ATTR: policies against the app's Cedar "
            "schema, broker handlers without a broker, the app's own start-up checks)"
        )

    def test_broker_handlers_without_a_broker_are_refused(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        (tmp_path / "consuming_app.py").write_text(
            "from bastion import Service\n\nservice = Service('consumer')\nservice.version(1)\n\n"
            "@service.subscribe('orders.created')\nasync def on_order(message: bytes) -> None:\n    pass\n"
        )
        path = tmp_path / "service.toml"
        path.write_text("[token]\nenabled = false\n")
        assert main(["check-config", str(path), "--app", "consuming_app:service", "--app-dir", str(tmp_path)]) == 2
        assert capsys.readouterr().err == (
            "error: the service declares broker streams or handlers (service.stream / subscribe / consume / respond) "
            "but no broker is configured: set broker.url (or SERVICE_BROKER_URL)\n"
        )
