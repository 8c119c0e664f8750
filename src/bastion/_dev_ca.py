"""``bastion dev-ca``: development only. A local CA, a server certificate and client certificates for trying mutual
TLS (docs/auth.md, "Service-to-service: mutual TLS"); like ``dev-keys``, never for production."""

from __future__ import annotations

import argparse
from pathlib import Path

EXIT_OK = 0
DEFAULT_CLIENTS = ("billing",)
DEFAULT_TRUST_DOMAIN = "example.test"


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "dev-ca", help="development only: a local CA with a server and client certificates for mutual TLS"
    )
    parser.add_argument("--dir", default=".dev/ca", help="where to write the PEM files (.dev/ca)")
    parser.add_argument("--server", default="invoices", help="server certificate name, for localhost (invoices)")
    parser.add_argument(
        "--client", action="append", metavar="NAME", help="client certificate name, repeatable (billing)"
    )
    parser.add_argument(
        "--trust-domain", default=DEFAULT_TRUST_DOMAIN, help="SPIFFE trust domain of the clients (example.test)"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from bastion_core.testing import DevCA

    directory = Path(args.dir)
    ca = DevCA()
    ca_cert, _ = ca.write(directory)
    server = ca.issue(args.server, dns=("localhost",), ips=("127.0.0.1", "::1"), server=True, client=False)
    server_cert, server_key = server.write(directory, args.server)
    print(f"CA (tls.client_ca_path, and the clients' trust): {ca_cert}")
    print(f"server certificate (service.tls_cert_path / tls_key_path): {server_cert} {server_key}")
    for name in args.client or DEFAULT_CLIENTS:
        spiffe = f"spiffe://{args.trust_domain}/{name}"
        cert, key = ca.issue(name, spiffe=spiffe, dns=(f"{name}.{args.trust_domain}",)).write(directory, name)
        print(f'client certificate Service::"{spiffe}": {cert} {key}')
    (directory / "crl.pem").write_bytes(ca.crl_pem())
    print(f"empty CRL (tls.crl_path): {directory / 'crl.pem'}")
    return EXIT_OK
