"""The main port's and ``grpc.port``'s TLS from the settings, and the client certificate a connection presented.

:func:`server_tls` builds the reloading server context once per process (the listener creates the port with
it; the app watches its files, answers SIGHUP and reports its metrics): the same settings give the same object.
:func:`client_certificate` turns the peer certificate OpenSSL verified (``ssl.SSLObject.getpeercert()``) into
the identity and attributes policies read.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bastion.config import Settings
from bastion.errors import ConfigError
from bastion_core._tls import CertificateFiles, CertificateSetError, ReloadingServerContext

SPIFFE_SCHEME = "spiffe://"
_servers: dict[tuple[object, ...], ReloadingServerContext] = {}


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientCertificate:
    """A verified client certificate: ``identity`` (from ``tls.identity_from``) and what Cedar may read."""

    identity: str
    spiffe_ids: tuple[str, ...] = ()
    dns_names: tuple[str, ...] = ()
    common_name: str | None = None
    issuer: str = ""
    serial: str = ""
    not_after: int = 0

    def attributes(self) -> dict[str, Any]:
        """The principal's attributes: ``identity``, ``sans`` (every URI and DNS SAN), ``issuer``, ``serial``,
        ``not_after`` (Unix seconds), ``common_name`` when present."""
        attributes: dict[str, Any] = {
            "identity": self.identity,
            "sans": [*self.spiffe_ids, *self.dns_names],
            "issuer": self.issuer,
            "serial": self.serial,
            "not_after": self.not_after,
        }
        if self.common_name is not None:
            attributes["common_name"] = self.common_name
        return attributes


def _name(rdns: Sequence[Sequence[tuple[str, str]]]) -> tuple[str | None, str]:
    """(subject CN, the whole name as ``key=value`` pairs joined by ``,``) of a ``getpeercert`` name."""
    pairs = [(key, value) for rdn in rdns for key, value in rdn]
    common = next((value for key, value in pairs if key == "commonName"), None)
    return common, ",".join(f"{key}={value}" for key, value in pairs)


def client_certificate(peer: Mapping[str, Any] | None, identity_from: Sequence[str]) -> ClientCertificate | None:
    """The identity and attributes of a verified peer certificate (``getpeercert()``'s dict); ``None`` without one
    or when none of ``identity_from`` gives a name."""
    if not peer:
        return None
    sans: Sequence[tuple[str, str]] = peer.get("subjectAltName", ())
    spiffe = tuple(value for kind, value in sans if kind == "URI" and value.startswith(SPIFFE_SCHEME))
    dns = tuple(value for kind, value in sans if kind == "DNS")
    common, _ = _name(peer.get("subject", ()))
    _, issuer = _name(peer.get("issuer", ()))
    found = {"spiffe": spiffe[0] if spiffe else None, "dns": dns[0] if dns else None, "cn": common}
    identity = next((found[source] for source in identity_from if found[source]), None)
    if identity is None:
        return None
    not_after = peer.get("notAfter")
    expiry = int(ssl.cert_time_to_seconds(not_after)) if isinstance(not_after, str) else 0
    return ClientCertificate(
        identity=identity,
        spiffe_ids=spiffe,
        dns_names=dns,
        common_name=common,
        issuer=issuer,
        serial=str(peer.get("serialNumber", "")),
        not_after=expiry,
    )


def connection_certificate(ssl_object: Any, identity_from: Sequence[str]) -> ClientCertificate | None:
    """The client certificate of a TLS connection (``transport.get_extra_info("ssl_object")``), if any."""
    if ssl_object is None:
        return None
    return client_certificate(ssl_object.getpeercert(), identity_from)


def server_tls(settings: Settings, *, alpn: Sequence[str] = ()) -> ReloadingServerContext | None:
    """The port's reloading TLS (``None`` without ``service.tls_cert_path``), one per process and settings.

    Raises ConfigError (one line) when the files do not make a usable set at start-up."""
    service, tls = settings.service, settings.tls
    if service.tls_cert_path is None or service.tls_key_path is None:
        return None
    files = CertificateFiles(
        cert_path=service.tls_cert_path,
        key_path=service.tls_key_path,
        ca_path=tls.client_ca_path if tls.mtls else None,
        crl_path=tls.crl_path if tls.mtls else None,
    )
    key = (files, tls.client_auth, tuple(alpn))
    found = _servers.get(key)
    if found is None:
        try:
            found = ReloadingServerContext(files, name="server", client_auth=tls.client_auth, alpn=alpn)
        except CertificateSetError as exc:
            raise ConfigError(f"service.tls_cert_path / tls: {exc}") from None
        _servers[key] = found
    return found


def port_alpn(settings: Settings) -> tuple[str, ...]:
    """What the main port offers in ALPN: ``h2`` too when gRPC shares it."""
    grpc = settings.grpc
    return ("h2", "http/1.1") if grpc.enabled and not grpc.use_separate_port else ("http/1.1",)


def reloaders(settings: Settings) -> list[ReloadingServerContext]:
    """The process's reloading server contexts: the main port's and, with TLS, ``grpc.port``'s."""
    found = [server_tls(settings, alpn=port_alpn(settings))]
    if settings.grpc.enabled and settings.grpc.use_separate_port:
        found.append(server_tls(settings, alpn=("h2",)))
    return [tls for tls in found if tls is not None]


async def watch(settings: Settings) -> None:
    """Re-read the TLS files when they change (every ``tls.reload_interval_secs``) and at once on SIGHUP (a single
    process; with ``--workers N`` uvicorn's supervisor restarts the workers on SIGHUP). Runs until cancelled."""
    contexts = reloaders(settings)
    if not contexts:
        return
    loop = asyncio.get_running_loop()

    def reload_all() -> None:
        for tls in contexts:
            tls.reload(reason="sighup")

    hup = False
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not the main thread, or Windows
        loop.add_signal_handler(signal.SIGHUP, reload_all)
        hup = True
    try:
        await asyncio.gather(*(tls.watch(settings.tls.reload_interval_secs) for tls in contexts))
    finally:
        if hup:
            loop.remove_signal_handler(signal.SIGHUP)


def report(settings: Settings) -> list[tuple[str, float | None, int, int]]:
    """``(port, seconds until the certificate expires, reloads done, reloads refused)`` per TLS port, for the
    metrics (read at each scrape)."""
    if settings.service.tls_cert_path is None:
        return []
    names = ["main", "grpc"]
    return [
        (name, context.expires_in(), context.counts.success, context.counts.failure)
        for name, context in zip(names, reloaders(settings), strict=False)
    ]


def posture(settings: Settings) -> dict[str, Any] | None:
    """The TLS settings for the posture line (``None`` without TLS): client certificates, CRL, identity order,
    credentials, reload interval."""
    if settings.service.tls_cert_path is None:
        return None
    tls = settings.tls
    fields: dict[str, Any] = {"client_auth": tls.client_auth, "reload_interval_secs": tls.reload_interval_secs}
    if tls.mtls:
        fields.update(
            crl=tls.crl_path is not None,
            identity_from=list(tls.identity_from),
            default_credentials=tls.default_credentials,
            path_credentials=dict(tls.path_credentials),
        )
    return fields


def posture_line(settings: Settings) -> str:
    """The TLS line of ``bastion check-config``."""
    fields = posture(settings)
    if fields is None:
        return "tls: off"
    reload = f"files re-read every {fields['reload_interval_secs']:g}s and on SIGHUP"
    if fields["client_auth"] == "none":
        return f"tls: on (no client certificates; {reload})"
    paths = fields["path_credentials"]
    rules = ", ".join(f"{path} {kind}" for path, kind in paths.items())
    return (
        f"tls: on (client certificates {fields['client_auth']}{', CRL checked' if fields['crl'] else ''}; identity "
        f"from {'>'.join(fields['identity_from'])}; credentials {fields['default_credentials']} by default"
        f"{'; ' + rules if rules else ''}; {reload})"
    )
