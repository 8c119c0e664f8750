"""The app's own settings inside handlers: ``settings: MySettings = Depends(app_settings)``."""

from __future__ import annotations

from typing import Any

from starlette.requests import HTTPConnection

from bastion.errors import ConfigError


def app_settings(connection: HTTPConnection) -> Any:
    """FastAPI dependency: the app's settings, validated at build from ``[app]`` and ``SERVICE_APP_*`` into the
    model given as ``Service(settings=...)`` (an instance of that model).

    Raises ConfigError (a 500) when the service declared no settings model.
    """
    app: Any = connection.scope.get("app")
    settings = getattr(app, "app_settings", None)
    if settings is None:
        raise ConfigError("Depends(app_settings) needs the service's settings model: Service(settings=YourSettings)")
    return settings
