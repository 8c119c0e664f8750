"""The served OpenAPI documents list what the pipeline answers: error responses, the bearer scheme, path patterns."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from bastion import Service, load_settings
from bastion.routing._openapi import SEGMENT_PATTERN
from bastion.testing import TokenMinter
from tests.conftest import open_settings

ERROR = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
INTEGER_HEADER = {"required": True, "schema": {"type": "integer"}}


class Note(BaseModel):
    title: str


class Error(BaseModel):
    """A service model that happens to be called Error."""

    reason: str


def notes_service() -> Service:
    service = Service("notes")
    v1 = service.version(1)

    @v1.get("/notes")
    async def list_notes() -> list[str]:
        return []

    @v1.post("/notes")
    async def create_note(note: Note) -> Note:
        return note

    @v1.get("/notes/{owner}/{number}")
    async def get_note(owner: str, number: int) -> Note:
        return Note(title=f"{owner}/{number}")

    @v1.get("/files/{file_path:path}")
    async def get_file(file_path: str) -> str:
        return file_path

    @v1.get("/public/status")
    async def status() -> dict[str, str]:
        return {"status": "ok"}

    @v1.get("/reports/{report_id}", responses={404: {"description": "No such report", "model": Note}})
    async def report(report_id: str) -> Note:
        return Note(title=report_id)

    service.use_resilience(name="notes", paths=["/api/v1/notes/*"])
    return service


@pytest.fixture(scope="module")
def public_key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "public.pem"
    path.write_bytes(TokenMinter("RS256").public_pem())
    return path


@pytest.fixture
def secured(tmp_path: Path, public_key: Path) -> Callable[..., Any]:
    """Settings with token auth (``/api/v1/public/*`` excluded), a policy, the local rate limiter."""
    policies = tmp_path / "p.cedar"
    policies.write_text("permit(principal, action, resource);")

    def make(**environ: str) -> Any:
        return load_settings(
            environ={
                "SERVICE_TOKEN_PUBLIC_KEY_PATH": str(public_key),
                "SERVICE_TOKEN_EXCLUDE_PATHS": "/api/v1/public/*",
                "SERVICE_POLICY_POLICY_PATH": str(policies),
                **environ,
            }
        )

    return make


async def document(client: httpx.AsyncClient) -> dict[str, Any]:
    response = await client.get("/api/v1/openapi.json")
    assert response.status_code == 200
    return response.json()  # type: ignore[no-any-return]


class TestResponsesPerOperation:
    async def test_protected_operation_with_a_body_lists_every_answer(
        self, asgi_client: Callable[..., httpx.AsyncClient], secured: Callable[..., Any]
    ) -> None:
        paths = (await document(asgi_client(notes_service(), secured())))["paths"]
        operation = paths["/api/v1/notes"]["post"]
        assert list(operation["responses"]) == ["200", "400", "401", "403", "413", "422", "429", "504"]
        assert operation["security"] == [{"bearerAuth": []}]

    async def test_public_operation_has_no_401_and_no_security(
        self, asgi_client: Callable[..., httpx.AsyncClient], secured: Callable[..., Any]
    ) -> None:
        paths = (await document(asgi_client(notes_service(), secured())))["paths"]
        operation = paths["/api/v1/public/status"]["get"]
        assert list(operation["responses"]) == ["200", "403", "429", "504"]
        assert "security" not in operation

    async def test_guarded_operation_with_path_parameters_lists_400_404_and_503(
        self, asgi_client: Callable[..., httpx.AsyncClient], secured: Callable[..., Any]
    ) -> None:
        paths = (await document(asgi_client(notes_service(), secured())))["paths"]
        operation = paths["/api/v1/notes/{owner}/{number}"]["get"]
        assert list(operation["responses"]) == ["200", "400", "401", "403", "404", "422", "429", "503", "504"]
        assert operation["responses"]["503"]["headers"] == {
            "Retry-After": {"description": "Seconds to wait before trying again.", **INTEGER_HEADER}
        }
        assert "503" not in paths["/api/v1/notes"]["get"]["responses"]  # the layer guards /api/v1/notes/* only

    async def test_with_every_layer_off_only_the_timeout_and_validation_remain(
        self, asgi_client: Callable[..., httpx.AsyncClient]
    ) -> None:
        settings = open_settings(environ={"SERVICE_RATE_LIMIT_AUTO_APPLY": "false"})
        document_ = await document(asgi_client(notes_service(), settings))
        assert list(document_["paths"]["/api/v1/notes"]["post"]["responses"]) == ["200", "400", "413", "422", "504"]
        assert list(document_["paths"]["/api/v1/notes"]["get"]["responses"]) == ["200", "504"]
        assert "securitySchemes" not in document_["components"]

    async def test_401_carries_its_challenge_header(
        self, asgi_client: Callable[..., httpx.AsyncClient], secured: Callable[..., Any]
    ) -> None:
        paths = (await document(asgi_client(notes_service(), secured())))["paths"]
        unauthorized = paths["/api/v1/notes"]["get"]["responses"]["401"]
        assert unauthorized["content"] == ERROR
        assert unauthorized["headers"] == {
            "WWW-Authenticate": {
                "description": 'The RFC 6750 challenge: Bearer, with error="invalid_token" for a bad token.',
                "required": True,
                "schema": {"type": "string"},
            }
        }

    async def test_429_carries_the_headers_the_limiter_sends(
        self, asgi_client: Callable[..., httpx.AsyncClient], secured: Callable[..., Any]
    ) -> None:
        document_ = await document(asgi_client(notes_service(), secured()))
        limited = document_["paths"]["/api/v1/notes"]["get"]["responses"]["429"]
        assert limited["content"] == {"application/json": {"schema": {"$ref": "#/components/schemas/RateLimitError"}}}
        assert set(limited["headers"]) == {
            "Retry-After",
            "X-RateLimit-Limit",
            "X-RateLimit-Remaining",
            "X-RateLimit-Reset",
        }
        assert document_["components"]["schemas"]["RateLimitError"]["required"] == [
            "error",
            "code",
            "status",
            "retry_after",
        ]

    async def test_422_is_in_the_error_shape_and_fastapis_models_are_gone(
        self, asgi_client: Callable[..., httpx.AsyncClient], secured: Callable[..., Any]
    ) -> None:
        document_ = await document(asgi_client(notes_service(), secured()))
        assert document_["paths"]["/api/v1/notes"]["post"]["responses"]["422"]["content"] == ERROR
        schemas = document_["components"]["schemas"]
        assert "HTTPValidationError" not in schemas and "ValidationError" not in schemas
        assert schemas["Error"]["required"] == ["error", "code", "status"]
        assert set(schemas["Error"]["properties"]) == {"error", "code", "status"}

    async def test_a_status_the_handler_documents_is_kept(
        self, asgi_client: Callable[..., httpx.AsyncClient], secured: Callable[..., Any]
    ) -> None:
        paths = (await document(asgi_client(notes_service(), secured())))["paths"]
        not_found = paths["/api/v1/reports/{report_id}"]["get"]["responses"]["404"]
        assert not_found == {
            "description": "No such report",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Note"}}},
        }

    async def test_a_service_model_called_error_keeps_its_name(
        self, asgi_client: Callable[..., httpx.AsyncClient], secured: Callable[..., Any]
    ) -> None:
        service = notes_service()

        @service.version(2).get("/problem")
        async def problem() -> Error:
            return Error(reason="none")

        v2 = (await asgi_client(service, secured()).get("/api/v2/openapi.json")).json()
        assert v2["components"]["schemas"]["Error"]["properties"] == {"reason": {"title": "Reason", "type": "string"}}
        assert v2["paths"]["/api/v2/problem"]["get"]["responses"]["401"]["content"] == {
            "application/json": {"schema": {"$ref": "#/components/schemas/BastionError"}}
        }


class TestPathParameters:
    async def test_plain_segments_declare_what_the_canonical_path_keeps(
        self, asgi_client: Callable[..., httpx.AsyncClient]
    ) -> None:
        paths = (await document(asgi_client(notes_service())))["paths"]
        owner, number = paths["/api/v1/notes/{owner}/{number}"]["get"]["parameters"]
        assert owner["schema"] == {"type": "string", "title": "Owner", "pattern": SEGMENT_PATTERN}
        assert number["schema"] == {"type": "integer", "title": "Number"}  # the type says it
        (file_path,) = paths["/api/v1/files/{file_path}"]["get"]["parameters"]
        assert "pattern" not in file_path["schema"]  # a :path parameter holds slashes

    @pytest.mark.parametrize("value", ["alice", "a b", "%2F", "...", ".hidden", "é", "x.y"])
    def test_pattern_accepts_what_reaches_the_route(self, value: str) -> None:
        assert re.fullmatch(SEGMENT_PATTERN, value)

    @pytest.mark.parametrize("value", ["", ".", "..", "a/b", "a\x00", "tab\there", "\x7f"])
    def test_pattern_refuses_what_the_canonical_path_splits_resolves_or_rejects(self, value: str) -> None:
        assert re.fullmatch(SEGMENT_PATTERN, value) is None
