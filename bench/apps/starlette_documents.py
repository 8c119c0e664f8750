"""The example's ``GET /api/v2/documents`` on bare Starlette: same store, query parameters and response model.

The handler a careful Starlette user writes for the same contract as ``fastapi_documents``: the two query
parameters checked by hand (422 when out of range, as FastAPI answers), the page validated into the same pydantic
``DocumentPage`` and serialized with pydantic (what a FastAPI ``response_model`` does). No middleware, no security:
issue 35's Starlette row ("every row serves the same handler").
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from examples.documents_api.api import PAGE_SIZE_DEFAULT, PAGE_SIZE_MAX, DocumentPage
from examples.documents_api.store import seeded_store

store = seeded_store()
MAX_CURSOR = 128


def _invalid(name: str) -> JSONResponse:
    return JSONResponse({"detail": [{"loc": ["query", name], "msg": "invalid"}]}, status_code=422)


async def list_documents(request: Request) -> Response:
    query = request.query_params
    raw_limit = query.get("limit")
    try:
        limit = PAGE_SIZE_DEFAULT if raw_limit is None else int(raw_limit)
    except ValueError:
        return _invalid("limit")
    if not 1 <= limit <= PAGE_SIZE_MAX:
        return _invalid("limit")
    cursor = query.get("cursor")
    if cursor is not None and len(cursor) > MAX_CURSOR:
        return _invalid("cursor")
    items, next_cursor = store.page(after=cursor, limit=limit)
    page = DocumentPage.model_validate({"items": [doc.as_dict() for doc in items], "next_cursor": next_cursor})
    return Response(page.model_dump_json(), media_type="application/json")


app = Starlette(routes=[Route("/api/v2/documents", list_documents)])
