"""The service of the listener-limit tests: ``GET /api/v1/ping`` answers ``{"pong": true}``, ``GET /api/v1/count/{n}``
answers ``{"n": n}`` (pipelined answers can be told apart), ``POST /api/v1/echo`` reads a JSON body."""

from bastion import Service

service = Service("listener-app", version="0.0.1")
v1 = service.version(1)


@v1.get("/ping")
async def ping() -> dict[str, bool]:
    return {"pong": True}


@v1.get("/count/{n}")
async def count(n: int) -> dict[str, int]:
    return {"n": n}


@v1.post("/echo")
async def echo(payload: dict[str, str]) -> dict[str, int]:
    return {"keys": len(payload)}
