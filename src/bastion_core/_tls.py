"""TLS credentials read from files, checked before use, and re-read when the files change (or on demand).

- :func:`load_server_context`: a server context from a certificate chain, its key, an optional client CA bundle
  and CRL. Refused (:class:`CertificateSetError`, one line) unless the key matches the certificate, the leaf is
  valid now, each certificate of the chain file is signed by the next one, and the CRL is signed by a CA of the
  bundle and not past its next update.
- :class:`ReloadingServerContext`: the context a listener is created with (``front``); each new handshake is
  switched, in its SNI callback (run for every ClientHello, with or without a server name), to the last good set.
  Connections already open keep the set they started with. A set that fails the checks is not used: the previous
  one keeps serving and one ``tls_reload_failed`` line is logged per change of the files.
- :class:`ReloadingClientContext`: an outbound context with a client certificate (httpx, NATS): a new good pair
  is loaded into the same context, so the client's next connection presents it.

Both poll the files' (size, mtime, inode) at ``interval`` (:meth:`watch`) and reload on :meth:`reload`
(SIGHUP in both programs). Used by Bastion (main port, ``grpc.port``, broker, ResilientTransport) and MailRelay
(STARTTLS).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import itertools
import os
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import structlog
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

ClientAuth = str
"""``"none"`` (no certificate asked), ``"optional"`` (verified when sent), ``"required"`` (handshake fails without)."""
CLIENT_AUTH_MODES = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}
DEFAULT_RELOAD_INTERVAL_SECS = 10.0
MAX_CREDENTIAL_FILE_BYTES = 4 * 1024 * 1024
"""A certificate, key, CA bundle or CRL file larger than this is refused (a mistaken path, not a credential)."""

log = structlog.get_logger("bastion_core.tls")


class CertificateSetError(ValueError):
    """A certificate set that cannot be used; the message is one line naming the file and what is wrong."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CertificateFiles:
    """Where a set's files are. ``ca_path``: for a server, the CAs client certificates must chain to; for a
    client, the CAs the server must chain to (``None``: the system's). ``crl_path``: PEM or DER CRLs (server)."""

    cert_path: str | None = None
    key_path: str | None = None
    ca_path: str | None = None
    crl_path: str | None = None

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(path for path in (self.cert_path, self.key_path, self.ca_path, self.crl_path) if path)


@dataclass(frozen=True, slots=True)
class LoadedSet:
    """One checked set: its context, the leaf's expiry (Unix seconds; ``None`` without a certificate) and the
    files' stamps it was read from."""

    context: ssl.SSLContext
    not_after: float | None
    stamp: tuple[object, ...]


def stamp_of(paths: Sequence[str]) -> tuple[object, ...]:
    """(size, mtime, inode) per file; a missing file stamps as ``None`` (so its return is a change too)."""
    stamps: list[object] = []
    for path in paths:
        try:
            status = os.stat(path)
        except OSError:
            stamps.append(None)
        else:
            stamps.append((status.st_size, status.st_mtime_ns, status.st_ino))
    return tuple(stamps)


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_CREDENTIAL_FILE_BYTES + 1)
    except OSError as exc:
        raise CertificateSetError(f"{what} {path!r} cannot be read ({exc.strerror or exc})") from None
    if len(data) > MAX_CREDENTIAL_FILE_BYTES:
        raise CertificateSetError(f"{what} {path!r} is larger than {MAX_CREDENTIAL_FILE_BYTES} bytes")
    return data


def _certificates(data: bytes, path: str, what: str) -> list[x509.Certificate]:
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        certs = []
    if not certs:
        raise CertificateSetError(f"{what} {path!r} holds no PEM certificate")
    return certs


def _check_chain(chain: list[x509.Certificate], path: str, now: datetime.datetime) -> float:
    """The leaf's expiry; CertificateSetError when the leaf is not valid at ``now`` or a link is broken."""
    leaf = chain[0]
    if leaf.not_valid_after_utc <= now:
        raise CertificateSetError(f"certificate {path!r} expired at {leaf.not_valid_after_utc.isoformat()}")
    if leaf.not_valid_before_utc > now:
        raise CertificateSetError(f"certificate {path!r} is not valid before {leaf.not_valid_before_utc.isoformat()}")
    for child, parent in itertools.pairwise(chain):
        try:
            child.verify_directly_issued_by(parent)
        except (ValueError, TypeError, InvalidSignature):
            raise CertificateSetError(
                f"certificate chain {path!r} is incomplete: {child.subject.rfc4514_string()!r} is not issued by the "
                f"next certificate in the file"
            ) from None
    return leaf.not_valid_after_utc.timestamp()


def _check_crl(data: bytes, path: str, cas: list[x509.Certificate], now: datetime.datetime) -> None:
    try:
        crl = x509.load_pem_x509_crl(data) if b"-----BEGIN" in data else x509.load_der_x509_crl(data)
    except ValueError:
        raise CertificateSetError(f"CRL {path!r} is not a PEM or DER certificate revocation list") from None
    if not any(ca.subject == crl.issuer and crl.is_signature_valid(ca.public_key()) for ca in cas):  # type: ignore[arg-type]
        raise CertificateSetError(f"CRL {path!r} is not signed by a CA of the client CA bundle")
    next_update = crl.next_update_utc
    if next_update is not None and next_update <= now:
        raise CertificateSetError(f"CRL {path!r} is out of date (next update was {next_update.isoformat()})")


def _check_key(cert_data: bytes, key_data: bytes, cert: x509.Certificate, key_path: str) -> None:
    try:
        key = serialization.load_pem_private_key(key_data, password=None)
    except (ValueError, TypeError):
        raise CertificateSetError(f"key {key_path!r} is not an unencrypted PEM private key") from None
    public = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    expected = cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    if public != expected:
        raise CertificateSetError(f"key {key_path!r} does not match its certificate")


def _identity(context: ssl.SSLContext, files: CertificateFiles, now: datetime.datetime) -> float | None:
    """Check and load the certificate and key into ``context``; the leaf's expiry."""
    if files.cert_path is None or files.key_path is None:
        return None
    cert_data = _read(files.cert_path, "certificate")
    key_data = _read(files.key_path, "key")
    chain = _certificates(cert_data, files.cert_path, "certificate")
    not_after = _check_chain(chain, files.cert_path, now)
    _check_key(cert_data, key_data, chain[0], files.key_path)
    try:
        context.load_cert_chain(files.cert_path, files.key_path)
    except (ssl.SSLError, OSError) as exc:
        raise CertificateSetError(
            f"certificate {files.cert_path!r} and key {files.key_path!r} do not load ({exc})"
        ) from None
    if (_read(files.cert_path, "certificate"), _read(files.key_path, "key")) != (cert_data, key_data):
        raise CertificateSetError(f"certificate {files.cert_path!r} or its key changed while being read")
    return not_after


def _trust(context: ssl.SSLContext, files: CertificateFiles, now: datetime.datetime) -> None:
    """Check and load the CA bundle and CRL into ``context``."""
    if files.ca_path is None:
        return
    ca_data = _read(files.ca_path, "CA bundle")
    cas = _certificates(ca_data, files.ca_path, "CA bundle")
    try:
        context.load_verify_locations(cadata=ca_data.decode("ascii", "replace"))
    except ssl.SSLError as exc:
        raise CertificateSetError(f"CA bundle {files.ca_path!r} does not load ({exc})") from None
    if files.crl_path is not None:
        _check_crl(_read(files.crl_path, "CRL"), files.crl_path, cas, now)
        try:
            context.load_verify_locations(cafile=files.crl_path)
        except ssl.SSLError as exc:
            raise CertificateSetError(f"CRL {files.crl_path!r} does not load ({exc})") from None
        context.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF


def load_server_context(
    files: CertificateFiles,
    *,
    client_auth: ClientAuth = "none",
    alpn: Sequence[str] = (),
    clock: Callable[[], float] = time.time,
) -> LoadedSet:
    """A checked server context (TLS 1.2 or later); CertificateSetError (one line) otherwise."""
    stamp = stamp_of(files.paths)
    now = datetime.datetime.fromtimestamp(clock(), datetime.UTC)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    not_after = _identity(context, files, now)
    _trust(context, files, now)
    context.verify_mode = CLIENT_AUTH_MODES[client_auth]
    if alpn:
        context.set_alpn_protocols(list(alpn))
    return LoadedSet(context, not_after, stamp)


def load_client_context(files: CertificateFiles, *, clock: Callable[[], float] = time.time) -> LoadedSet:
    """A checked client context: the system's CAs (or ``ca_path``'s), hostname checks, and the client certificate."""
    stamp = stamp_of(files.paths)
    now = datetime.datetime.fromtimestamp(clock(), datetime.UTC)
    context = ssl.create_default_context()
    if files.ca_path is not None:
        _certificates(_read(files.ca_path, "CA bundle"), files.ca_path, "CA bundle")
        context = ssl.create_default_context(cafile=files.ca_path)
    not_after = _identity(context, files, now)
    return LoadedSet(context, not_after, stamp)


@dataclass(slots=True)
class ReloadCounts:
    success: int = 0
    failure: int = 0


@dataclass(slots=True)
class _Reloader:
    """What both reloading contexts share: the files, the poll, the counters, the one error line per change."""

    files: CertificateFiles
    name: str
    load: Callable[[], LoadedSet]
    current: LoadedSet
    counts: ReloadCounts = field(default_factory=ReloadCounts)
    failed_stamp: tuple[object, ...] | None = None
    clock: Callable[[], float] = time.time

    def changed(self) -> bool:
        stamp = stamp_of(self.files.paths)
        return stamp != self.current.stamp and stamp != self.failed_stamp

    def reload(self, *, reason: str = "signal") -> LoadedSet | None:
        """Load and check the files now; the new set, or ``None`` (the previous set stays, one error line)."""
        try:
            loaded = self.load()
        except CertificateSetError as exc:
            self.counts.failure += 1
            self.failed_stamp = stamp_of(self.files.paths)
            log.error("tls_reload_failed", tls=self.name, reason=reason, error=str(exc), kept="previous")
            return None
        self.counts.success += 1
        self.failed_stamp = None
        self.current = loaded
        self.apply(loaded)
        log.info("tls_reloaded", tls=self.name, reason=reason, not_after=loaded.not_after)
        return loaded

    def expires_in(self) -> float | None:
        not_after = self.current.not_after
        return None if not_after is None else not_after - self.clock()

    async def watch(self, interval: float = DEFAULT_RELOAD_INTERVAL_SECS) -> None:
        """Poll the files every ``interval`` seconds and reload on a change; runs until cancelled."""
        while True:
            await asyncio.sleep(interval)
            if self.changed():
                self.reload(reason="file_changed")

    def apply(self, loaded: LoadedSet) -> None:
        """Make a newly loaded set the one new connections use (each context kind does it its own way)."""


class ReloadingServerContext(_Reloader):
    """A listener's TLS: create the server with :attr:`front`; each handshake gets the last good set."""

    def __init__(
        self,
        files: CertificateFiles,
        *,
        name: str = "server",
        client_auth: ClientAuth = "none",
        alpn: Sequence[str] = (),
        clock: Callable[[], float] = time.time,
    ) -> None:
        def load() -> LoadedSet:
            return load_server_context(files, client_auth=client_auth, alpn=alpn, clock=clock)

        super().__init__(files=files, name=name, load=load, current=load(), clock=clock)
        self.client_auth = client_auth
        self.front = self.current.context
        self.front.sni_callback = self._select

    def _select(self, connection: ssl.SSLObject | ssl.SSLSocket, _name: str | None, front: ssl.SSLContext) -> None:
        latest = self.current.context
        if latest is not front:
            connection.context = latest


class ReloadingClientContext(_Reloader):
    """An outbound TLS context presenting a client certificate; a rotated pair goes into the same :attr:`context`."""

    def __init__(
        self, files: CertificateFiles, *, name: str = "client", clock: Callable[[], float] = time.time
    ) -> None:
        def load() -> LoadedSet:
            return load_client_context(files, clock=clock)

        super().__init__(files=files, name=name, load=load, current=load(), clock=clock)
        self.context = self.current.context

    def apply(self, loaded: LoadedSet) -> None:
        if self.files.cert_path is None or self.files.key_path is None:
            return
        with contextlib.suppress(ssl.SSLError, OSError):  # checked a moment ago; a change since is the next poll's
            self.context.load_cert_chain(self.files.cert_path, self.files.key_path)
