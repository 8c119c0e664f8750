"""Secure by default, end to end: configs written from the spec's tables, refusals, WebSockets, operator layers.

Every config here is written as a user copies it from the spec: no key the spec does not name.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import grpc
import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from bastion.testing import TokenMinter
from examples.documents_api.proto.documents.v1 import documents_pb2 as pb
from examples.documents_api.proto.documents.v1 import documents_pb2_grpc as pb_grpc
from tests.conftest import BASTION, REPO, TOKEN_OFF, BastionProcess

EXAMPLE_APP = "examples.documents_api:service"
EXAMPLE_POLICIES = REPO / "examples" / "documents_api" / "policies.cedar"
NO_KEY = (
    "error: token authentication has no key: set token.public_key_path, token.secret, token.key_path or "
    "token.jwks_url, or token.enabled = false to serve every business route without a token"
)

# The spec's [token] / [jwt] table, key for key (the JWT keys).
SPEC_TOKEN_SECTION = """\
[{section}]
algorithm = "RS256"
public_key_path = "public.pem"
revocation_enabled = true
leeway_seconds = 30
exclude_paths = ["/api/v2/openapi.json"]
"""


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory: pytest.TempPathFactory, minter: TokenMinter) -> Path:
    """A directory with the public key and a copy of the example's policies (configs use relative paths)."""
    path = tmp_path_factory.mktemp("conf")
    (path / "public.pem").write_bytes(minter.public_pem())
    (path / "policies.cedar").write_text(EXAMPLE_POLICIES.read_text())
    return path


def bearer(minter: TokenMinter, sub: str = "alice", *roles: str) -> dict[str, str]:
    return {"authorization": "Bearer " + minter.mint(sub=sub, roles=list(roles) or ["user"])}


def run(*args: str, env: dict[str, str] | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [BASTION, *args], cwd=cwd, capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})}
    )


class TestSpecTokenTable:
    @pytest.mark.parametrize("section", ["token", "jwt"])
    def test_section_from_the_spec_protects_every_route(
        self, bastion_process: Callable[..., BastionProcess], config_dir: Path, minter: TokenMinter, section: str
    ) -> None:
        config = config_dir / f"{section}.toml"
        config.write_text(SPEC_TOKEN_SECTION.format(section=section))
        process = bastion_process(EXAMPLE_APP, "--config", str(config))
        anonymous = httpx.get(process.url + "/api/v2/documents")
        assert anonymous.status_code == 401
        assert anonymous.json() == {"error": "Missing bearer token", "code": "UNAUTHORIZED", "status": 401}
        assert httpx.get(process.url + "/api/v2/documents", headers=bearer(minter)).status_code == 200
        assert httpx.get(process.url + "/api/v2/openapi.json").status_code == 200  # exclude_paths
        assert httpx.get(process.url + "/health").status_code == 200

    def test_token_keys_from_the_environment_only(
        self, bastion_process: Callable[..., BastionProcess], config_dir: Path, minter: TokenMinter
    ) -> None:
        env = {
            "SERVICE_TOKEN_ALGORITHM": "RS256",
            "SERVICE_TOKEN_PUBLIC_KEY_PATH": str(config_dir / "public.pem"),
            "SERVICE_TOKEN_LEEWAY_SECONDS": "30",
        }
        process = bastion_process(EXAMPLE_APP, env=env)
        assert httpx.get(process.url + "/api/v2/documents").status_code == 401
        assert httpx.get(process.url + "/api/v2/documents", headers=bearer(minter)).status_code == 200

    def test_start_up_logs_the_posture(self, bastion_process: Callable[..., BastionProcess], config_dir: Path) -> None:
        config = config_dir / "posture.toml"
        config.write_text(SPEC_TOKEN_SECTION.format(section="token") + '[policy]\npolicy_path = "policies.cedar"\n')
        process = bastion_process(EXAMPLE_APP, "--config", str(config))
        process.wait_for_output("security_posture")
        line = next(json.loads(raw) for raw in process.output().splitlines() if '"security_posture"' in raw)
        assert line["token"] == {
            "enabled": True,
            "format": "jwt",
            "algorithm": "RS256",
            "key": "token.public_key_path",
            "public_paths": ["/api/v2/openapi.json"],
        }
        assert line["policy"]["enabled"] is True and line["policy"]["statements"] == 6
        assert line["rate_limit"]["mode"] == "local"
        assert (line["revocation"], line["grpc"], line["tls"]) == ("memory", "off", False)


class TestRefusals:
    def test_no_token_key_refuses_to_start(self) -> None:
        result = run("run", EXAMPLE_APP, "--port", "0")
        assert result.returncode == 2
        assert result.stderr.strip().splitlines() == [NO_KEY]

    def test_explicit_opt_out_serves_without_a_token(self, bastion_process: Callable[..., BastionProcess]) -> None:
        process = bastion_process(EXAMPLE_APP, env=TOKEN_OFF)
        assert httpx.get(process.url + "/api/v2/documents").status_code == 200
        assert httpx.get(process.url + "/ready").status_code == 200

    @pytest.mark.parametrize(
        ("config", "error"),
        [
            pytest.param(
                '[token]\npublic_key_path = "absent.pem"\n',
                "token.public_key_path = '{dir}/absent.pem': cannot read the file (no such file)",
                id="missing-key-file",
            ),
            pytest.param(
                '[token]\npublic_key_path = "public.pem"\n[policy]\npolicy_path = "absent.cedar"\n',
                "policy.policy_path = '{dir}/absent.cedar': cannot read the file (no such file)",
                id="missing-policy-file",
            ),
            pytest.param(
                '[token]\npublic_key_path = "public.pem"\n[policy]\npolicy_path = "broken.cedar"\n',
                "policy.policy_path = '{dir}/broken.cedar' does not parse: statement 1 (line 1): ",
                id="broken-policy-file",
            ),
            pytest.param("[token]\nleeway_seconds = 30\n", NO_KEY.removeprefix("error: "), id="no-key"),
        ],
    )
    def test_check_config_refuses_what_run_refuses(self, config_dir: Path, config: str, error: str) -> None:
        (config_dir / "broken.cedar").write_text("permit(principal, action resource);")
        path = config_dir / "refused.toml"
        path.write_text(config)
        expected = "error: " + error.format(dir=config_dir)
        checked = run("check-config", str(path))
        ran = run("run", EXAMPLE_APP, "--config", str(path), "--port", "0")
        for result in (checked, ran):
            assert result.returncode == 2
            assert result.stderr.strip().startswith(expected), result.stderr
            assert len(result.stderr.strip().splitlines()) == 1
            assert "Traceback" not in result.stderr

    def test_relative_paths_follow_the_config_file_not_the_working_directory(
        self, config_dir: Path, tmp_path: Path
    ) -> None:
        path = config_dir / "relative.toml"
        path.write_text('[token]\npublic_key_path = "public.pem"\n[policy]\npolicy_path = "policies.cedar"\n')
        result = run("check-config", str(path), cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert "policy: " + str(config_dir / "policies.cedar") + ", 6 statements" in result.stderr


class TestPolicyWithoutTokenAuth:
    def test_anonymous_request_on_a_role_only_route_is_denied(
        self, bastion_process: Callable[..., BastionProcess], config_dir: Path
    ) -> None:
        config = config_dir / "policy-only.toml"
        config.write_text('[token]\nenabled = false\n[policy]\npolicy_path = "policies.cedar"\n')
        process = bastion_process(EXAMPLE_APP, "--config", str(config))
        for path in ("/api/v2/documents", "/api/v2/admin/users"):
            response = httpx.get(process.url + path)
            assert response.status_code == 403, path
            assert response.json() == {"error": "Access denied by policy", "code": "FORBIDDEN", "status": 403}
        assert httpx.get(process.url + "/api/v2/openapi.json").status_code == 200  # permitted to Anonymous


class TestMethodNotAllowedBeforePolicy:
    @pytest.mark.parametrize("roles", [("user",), ("admin",)], ids=["user", "admin"])
    def test_unknown_method_is_405_for_every_caller(
        self, bastion_process: Callable[..., BastionProcess], config_dir: Path, minter: TokenMinter, roles: tuple[str]
    ) -> None:
        config = config_dir / "methods.toml"
        config.write_text('[token]\npublic_key_path = "public.pem"\n[policy]\npolicy_path = "policies.cedar"\n')
        process = bastion_process(EXAMPLE_APP, "--config", str(config))
        for method in ("TRACE", "PATCH"):
            response = httpx.request(method, process.url + "/api/v2/admin/users", headers=bearer(minter, "u", *roles))
            assert response.status_code == 405
            assert response.json() == {"error": "Method not allowed", "code": "METHOD_NOT_ALLOWED", "status": 405}
            assert response.headers["allow"] == "GET"


WS_POLICIES = """\
@id("readers")
permit(principal is User, action in [Action::"GET /api/v2/notes", Action::"GET /api/v2/notes/live"], resource)
when { principal.roles.contains("reader") };
"""


@pytest.fixture(scope="module")
def ws(module_bastion_process: Callable[..., BastionProcess], config_dir: Path) -> BastionProcess:
    (config_dir / "ws.cedar").write_text(WS_POLICIES)
    config = config_dir / "ws.toml"
    config.write_text('[token]\npublic_key_path = "public.pem"\n[policy]\npolicy_path = "ws.cedar"\n')
    return module_bastion_process("tests.e2e.apps.ws_service:service", "--config", str(config))


class TestWebSocketHandshakes:
    @staticmethod
    def handshake(process: BastionProcess, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        """``(101, first message)`` for an accepted handshake, else the refusal's status and body."""
        url = f"ws://127.0.0.1:{process.port}{path}"
        try:
            with connect(url, additional_headers=headers or {}, open_timeout=10, close_timeout=5) as socket:
                socket.send("hello")
                return 101, str(socket.recv(timeout=10)).encode()
        except InvalidStatus as exc:
            return exc.response.status_code, bytes(exc.response.body or b"")

    def test_no_token_is_401(self, ws: BastionProcess) -> None:
        assert self.handshake(ws, "/api/v2/notes/live") == (
            401,
            b'{"error":"Missing bearer token","code":"UNAUTHORIZED","status":401}',
        )

    def test_bad_token_is_401(self, ws: BastionProcess) -> None:
        status, body = self.handshake(ws, "/api/v2/notes/live", {"authorization": "Bearer not.a.token"})
        assert (status, json.loads(body)["code"]) == (401, "INVALID_TOKEN")

    def test_token_from_another_key_is_401(self, ws: BastionProcess) -> None:
        stranger = TokenMinter("RS256").mint(sub="alice", roles=["reader"])
        status, body = self.handshake(ws, "/api/v2/notes/live", {"authorization": f"Bearer {stranger}"})
        assert (status, json.loads(body)["code"]) == (401, "INVALID_TOKEN")

    def test_caller_without_the_role_is_403(self, ws: BastionProcess, minter: TokenMinter) -> None:
        assert self.handshake(ws, "/api/v2/notes/live", bearer(minter, "bob", "user")) == (
            403,
            b'{"error":"Access denied by policy","code":"FORBIDDEN","status":403}',
        )

    def test_reader_is_accepted(self, ws: BastionProcess, minter: TokenMinter) -> None:
        assert self.handshake(ws, "/api/v2/notes/live", bearer(minter, "alice", "reader")) == (101, b"echo: hello")

    @pytest.mark.parametrize("path", ["/api/v2/notes", "/health"])
    def test_upgrade_to_a_non_websocket_route_is_404(self, ws: BastionProcess, minter: TokenMinter, path: str) -> None:
        assert self.handshake(ws, path, bearer(minter, "alice", "reader")) == (404, b"")

    def test_refusals_are_logged_without_errors(self, ws: BastionProcess, minter: TokenMinter) -> None:
        self.handshake(ws, "/api/v2/notes/live")
        lines = [json.loads(line) for line in ws.output().splitlines() if line.startswith("{")]
        assert lines and [line for line in lines if line["level"] == "error"] == []


@pytest.fixture(scope="module")
def api_key(module_bastion_process: Callable[..., BastionProcess]) -> BastionProcess:
    return module_bastion_process(
        "tests.e2e.apps.api_key_service:service", env={**TOKEN_OFF, "SERVICE_GRPC_ENABLED": "true"}
    )


class TestOperatorLayerGuardsGrpc:
    def test_http_needs_the_key(self, api_key: BastionProcess) -> None:
        assert httpx.get(api_key.url + "/api/v2/documents").status_code == 401
        assert httpx.get(api_key.url + "/api/v2/documents", headers={"x-api-key": "letmein"}).status_code == 200

    def test_grpc_call_without_the_key_is_unauthenticated(self, api_key: BastionProcess) -> None:
        with grpc.insecure_channel(f"127.0.0.1:{api_key.port}") as channel:
            stub = pb_grpc.DocumentServiceStub(channel)
            with pytest.raises(grpc.RpcError) as info:
                stub.ListDocuments(pb.ListDocumentsRequest(), timeout=10)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            reply = stub.ListDocuments(pb.ListDocumentsRequest(), metadata=[("x-api-key", "letmein")], timeout=10)
            assert [doc.id for doc in reply.items][:1] == ["doc-1"]

    def test_http_only_layer_with_grpc_refuses_to_start(self, tmp_path: Path) -> None:
        app = tmp_path / "http_only.py"
        app.write_text(
            "from tests.e2e.apps.api_key_service import api_key_layer, service\n"
            "from bastion import Slot\n"
            "service.use(Slot.POLICY, api_key_layer)\n"
        )
        result = run(
            "run",
            "http_only:service",
            "--app-dir",
            str(tmp_path),
            "--port",
            "0",
            env={"PYTHONPATH": str(REPO), **TOKEN_OFF, "SERVICE_GRPC_ENABLED": "true"},
        )
        assert result.returncode == 2
        assert result.stderr.strip() == (
            "error: service.use(Slot.POLICY, layer) guards HTTP only and gRPC is enabled: pass "
            "service.use(Slot.POLICY, layer, grpc=hook) with an async hook(scope) that checks every gRPC call the "
            "same way, or set grpc.enabled = false"
        )
