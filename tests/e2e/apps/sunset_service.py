"""Versions for the sunset tests: v1 past its enforced sunset, v2 in a brownout that covers all of its time
(share 1), v3 past a sunset that is only announced, v4 current, v5 deprecated for the caller counts alone."""

from bastion import Brownout, Service

service = Service("sunset-service", version="0.0.1")
for number in (1, 2, 3, 4, 5):
    version = service.version(number)

    @version.get("/items")
    async def items() -> list[str]:
        return ["a"]


service.deprecate(1, replacement=4, sunset="2020-01-01T00:00:00Z", enforce_sunset=True, since="2019-01-01T00:00:00Z")
service.deprecate(
    2,
    replacement=4,
    sunset="2099-01-01T00:00:00Z",
    brownout=Brownout(start="2020-01-01T00:00:00Z", share=1.0),
    since="2019-06-01T00:00:00Z",
)
service.deprecate(3, replacement=4, sunset="2020-01-01T00:00:00Z", since="2019-01-01T00:00:00Z")
service.deprecate(5, replacement=4, since="2019-01-01T00:00:00Z")
