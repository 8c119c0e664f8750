"""Service-to-service with mutual TLS (docs/auth.md, "Service-to-service: mutual TLS").

``invoices``: ``bastion run examples.mtls.invoices:service --config examples/mtls/invoices.toml``; only the
billing service's certificate (``Service::"spiffe://example.test/billing"``) may ``POST /api/v1/invoices``.
``billing``: ``bastion run examples.mtls.billing:service --config examples/mtls/billing.toml``; its
``POST /api/v1/charges`` calls the invoices service with its client certificate (``ResilientTransport``).
"""
