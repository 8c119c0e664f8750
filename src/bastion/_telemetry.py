"""Logging set-up for the ``bastion`` process."""

from __future__ import annotations

import logging

from bastion_core import configure_logging as core_configure_logging


def configure_logging(level: str = "info", fmt: str = "auto") -> None:
    """The shared log set-up (``bastion_core.configure_logging``: JSON in production, console in development),
    with uvicorn's loggers routed through it and its access log off: Bastion writes its own, with masked
    headers."""
    core_configure_logging(level, fmt)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    logging.getLogger("uvicorn.access").disabled = True
