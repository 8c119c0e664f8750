"""TLS credentials from files: what a set must pass before use, and reloading that keeps the last good set."""

from __future__ import annotations

import datetime
import ssl
from pathlib import Path

import pytest
import structlog

from bastion_core import (
    CertificateFiles,
    CertificateSetError,
    ReloadingClientContext,
    ReloadingServerContext,
)
from bastion_core._tls import load_server_context
from bastion_core.testing import DevCA, Issued

NOW = datetime.datetime.now(datetime.UTC)


@pytest.fixture(scope="module")
def ca() -> DevCA:
    return DevCA()


def server_files(directory: Path, ca: DevCA, issued: Issued | None = None, *, crl: bool = False) -> CertificateFiles:
    ca.write(directory)
    cert, key = (issued or ca.issue("server", dns=("localhost",), server=True)).write(directory, "server")
    if crl:
        (directory / "crl.pem").write_bytes(ca.crl_pem())
    return CertificateFiles(
        cert_path=str(cert),
        key_path=str(key),
        ca_path=str(directory / "ca.pem"),
        crl_path=str(directory / "crl.pem") if crl else None,
    )


def test_a_good_set_loads_with_its_expiry(tmp_path: Path, ca: DevCA) -> None:
    loaded = load_server_context(server_files(tmp_path, ca, crl=True), client_auth="required", alpn=("http/1.1",))
    assert loaded.context.verify_mode == ssl.CERT_REQUIRED
    assert loaded.context.verify_flags & ssl.VERIFY_CRL_CHECK_LEAF
    assert loaded.not_after is not None and loaded.not_after > NOW.timestamp() + 29 * 86400


class TestRefusedSets:
    def test_key_of_another_certificate(self, tmp_path: Path, ca: DevCA) -> None:
        files = server_files(tmp_path, ca)
        Path(files.key_path or "").write_bytes(ca.issue("other", server=True).key_pem)
        with pytest.raises(CertificateSetError, match="does not match its certificate"):
            load_server_context(files)

    def test_expired_certificate(self, tmp_path: Path, ca: DevCA) -> None:
        old = ca.issue("old", server=True, valid_from=NOW - datetime.timedelta(days=10), valid_days=1)
        with pytest.raises(CertificateSetError, match="expired at"):
            load_server_context(server_files(tmp_path, ca, old))

    def test_certificate_not_yet_valid(self, tmp_path: Path, ca: DevCA) -> None:
        future = ca.issue("future", server=True, valid_from=NOW + datetime.timedelta(days=1))
        with pytest.raises(CertificateSetError, match="is not valid before"):
            load_server_context(server_files(tmp_path, ca, future))

    def test_chain_with_a_certificate_of_another_issuer(self, tmp_path: Path, ca: DevCA) -> None:
        leaf = ca.issue("server", server=True)
        broken = Issued(leaf.cert_pem + DevCA("unrelated").cert_pem, leaf.key_pem, leaf.serial)
        with pytest.raises(CertificateSetError, match=r"chain .* is incomplete"):
            load_server_context(server_files(tmp_path, ca, broken))

    def test_crl_of_another_ca(self, tmp_path: Path, ca: DevCA) -> None:
        files = server_files(tmp_path, ca, crl=True)
        Path(files.crl_path or "").write_bytes(DevCA("other").crl_pem())
        with pytest.raises(CertificateSetError, match="not signed by a CA of the client CA bundle"):
            load_server_context(files, client_auth="required")

    def test_unreadable_file(self, tmp_path: Path, ca: DevCA) -> None:
        files = server_files(tmp_path, ca)
        Path(files.cert_path or "").unlink()
        with pytest.raises(CertificateSetError, match="cannot be read"):
            load_server_context(files)

    def test_file_that_is_not_pem(self, tmp_path: Path, ca: DevCA) -> None:
        files = server_files(tmp_path, ca)
        Path(files.cert_path or "").write_text("not a certificate")
        with pytest.raises(CertificateSetError, match="holds no PEM certificate"):
            load_server_context(files)


class TestReloading:
    def test_a_broken_rotation_keeps_the_previous_set_and_logs_once(self, tmp_path: Path, ca: DevCA) -> None:
        tls = ReloadingServerContext(server_files(tmp_path, ca))
        before = tls.current
        Path(tls.files.key_path or "").write_bytes(ca.issue("other", server=True).key_pem)
        with structlog.testing.capture_logs() as logs:
            assert tls.changed()
            assert tls.reload(reason="file_changed") is None
            assert not tls.changed()  # the same broken files are not tried (nor logged) again
        assert tls.current is before
        assert [entry["event"] for entry in logs] == ["tls_reload_failed"]
        assert (tls.counts.success, tls.counts.failure) == (0, 1)

    def test_a_good_rotation_is_what_new_handshakes_get(self, tmp_path: Path, ca: DevCA) -> None:
        tls = ReloadingServerContext(server_files(tmp_path, ca))
        server_files(tmp_path, ca, ca.issue("renewed", server=True, valid_days=60))
        assert tls.changed()
        loaded = tls.reload(reason="file_changed")
        assert loaded is not None and tls.current is loaded and tls.front is not loaded.context
        assert (tls.counts.success, tls.counts.failure) == (1, 0)
        assert (tls.expires_in() or 0) > 59 * 86400

    def test_client_context_takes_the_new_pair_in_place(self, tmp_path: Path, ca: DevCA) -> None:
        ca.write(tmp_path)
        cert, key = ca.issue("billing", spiffe="spiffe://example.test/billing").write(tmp_path, "billing")
        files = CertificateFiles(cert_path=str(cert), key_path=str(key), ca_path=str(tmp_path / "ca.pem"))
        client = ReloadingClientContext(files)
        live = client.context
        ca.issue("billing", spiffe="spiffe://example.test/billing", valid_days=90).write(tmp_path, "billing")
        assert client.reload() is not None
        assert client.context is live  # httpx and nats-py keep the context they were given
        assert (client.expires_in() or 0) > 89 * 86400


def test_resilient_transport_takes_client_tls_or_a_transport_not_both(tmp_path: Path, ca: DevCA) -> None:
    import httpx

    from bastion_core import Guard, ResilientTransport

    ca.write(tmp_path)
    cert, key = ca.issue("billing").write(tmp_path, "billing")
    client_tls = ReloadingClientContext(CertificateFiles(cert_path=str(cert), key_path=str(key)))
    with pytest.raises(ValueError, match="pass client_tls or a transport of your own, not both"):
        ResilientTransport(Guard(), httpx.AsyncHTTPTransport(), client_tls=client_tls)
