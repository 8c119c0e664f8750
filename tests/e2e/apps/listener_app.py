"""A one-route service for the listener-limit tests: ``GET /api/v1/ping`` answers ``{"pong": true}``."""

from bastion import Service

service = Service("listener-app", version="0.0.1")
v1 = service.version(1)


@v1.get("/ping")
async def ping() -> dict[str, bool]:
    return {"pong": True}
