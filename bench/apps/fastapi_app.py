"""Bare FastAPI: one JSON route, no middleware, no dependencies."""

from __future__ import annotations

from fastapi import FastAPI

app = FastAPI()


@app.get("/")
async def hello() -> dict[str, str]:
    return {"hello": "world"}
