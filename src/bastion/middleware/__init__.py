"""The HTTP middleware, one pure-ASGI module each. Internal: ``bastion._pipeline`` lists and assembles them;
configure them in ``[middleware]``."""

__all__: list[str] = []
