"""Bastion's extras (docs/installation.md): the optional features whose client packages ``pip install bastion``
leaves out, the modules each brings, and the setting that turns the feature on.

``check(settings)`` runs first at start-up (``bastion run``, ``bastion check-config``): a configured feature
whose extra is missing stops it with one line, ``[broker] needs the broker extra: pip install
'bastion[broker]'``. Each feature's builder requires its extra again where it imports the packages (a service
built in-process, e.g. by ``bastion.testing``, gets the same line).
"""

from __future__ import annotations

from bastion.config import Settings
from bastion_core._extras import Extra

DISTRIBUTION = "bastion"
GRPC = Extra(
    distribution=DISTRIBUTION,
    name="grpc",
    modules=("grpclib", "h2", "hpack", "hyperframe", "google.protobuf"),
    feature="[grpc]",
)
BROKER = Extra(distribution=DISTRIBUTION, name="broker", modules=("nats",), feature="[broker]")
REDIS = Extra(distribution=DISTRIBUTION, name="redis", modules=("redis",), feature="[cache_store] url")
TRACING = Extra(
    distribution=DISTRIBUTION,
    name="tracing",
    modules=("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http"),
    feature="[tracing]",
)
EXTRAS = (GRPC, BROKER, REDIS, TRACING)


def configured(settings: Settings) -> tuple[Extra, ...]:
    """The extras the settings turn on."""
    on = {
        GRPC: settings.grpc.enabled,
        BROKER: settings.broker is not None and settings.broker.active,
        REDIS: settings.cache_store.url is not None,
        TRACING: settings.tracing.active,
    }
    return tuple(extra for extra in EXTRAS if on[extra])


def check(settings: Settings) -> None:
    """Raise MissingExtra for the first configured feature whose extra is not installed."""
    for extra in configured(settings):
        extra.require()
