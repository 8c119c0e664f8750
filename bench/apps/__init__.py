"""The peer servers of the benchmark: one module per scenario, each exposing an ASGI ``app`` or a ``main``."""
