"""Schemathesis, every check, against a real ``bastion run`` of the example: v1 and v2 (docs/api-docs.md).

``make schemathesis`` runs :func:`main`; ``tests/e2e/test_api_docs.py`` runs :func:`run` for each version. The
runs are bounded (``MAX_EXAMPLES`` cases per operation and phase, a fixed seed) and leave nothing behind: the
schemathesis CLI works in a temporary directory, without its example database.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bastion.testing import TokenMinter

SCHEMATHESIS = str(Path(sys.executable).with_name("schemathesis"))
EXAMPLE = ("examples.documents_api:service", "--config", "examples/documents_api/config.toml")
VERSIONS = (1, 2)
MAX_EXAMPLES = 10
SEED = 20
TIMEOUT_SECS = 120.0


def command(url: str, token: str, report: Path) -> list[str]:
    """The CLI run: all checks, every phase, a user's bearer token on every request, a JSON report."""
    return [
        SCHEMATHESIS,
        "run",
        url,
        "--checks",
        "all",
        "--header",
        f"Authorization: Bearer {token}",
        "--max-examples",
        str(MAX_EXAMPLES),
        "--seed",
        str(SEED),
        "--workers",
        "1",
        "--generation-database",
        "none",
        "--report",
        "json",
        "--report-json-path",
        str(report),
        "--no-color",
    ]


def run(base_url: str, version: int, token: str, *, capture: bool = True) -> tuple[int, dict[str, Any], str]:
    """Run the CLI on ``{base_url}/api/v<version>/openapi.json``: its exit code, JSON report and output."""
    with tempfile.TemporaryDirectory(prefix="schemathesis-") as workdir:
        report = Path(workdir) / "report.json"
        result = subprocess.run(
            command(f"{base_url}/api/v{version}/openapi.json", token, report),
            cwd=workdir,
            capture_output=capture,
            text=True,
            timeout=TIMEOUT_SECS,
            check=False,
        )
        return result.returncode, json.loads(report.read_text()), result.stdout if capture else ""


def main() -> int:
    """Start the example with a fresh key, run every version, and exit non-zero when any run failed."""
    from tests.conftest import BastionProcess

    minter = TokenMinter("RS256")
    with tempfile.TemporaryDirectory(prefix="bastion-schemathesis-") as directory:
        key = Path(directory) / "public.pem"
        key.write_bytes(minter.public_pem())
        process = BastionProcess(
            list(EXAMPLE), env={"SERVICE_TOKEN_PUBLIC_KEY_PATH": str(key)}, log_path=Path(directory) / "bastion.log"
        )
        try:
            process.wait_ready()
            token = minter.mint(sub="alice", roles=["user"], ttl=3600)
            codes = [run(process.url, version, token, capture=False)[0] for version in VERSIONS]
        finally:
            process.stop()
    return max(codes)


if __name__ == "__main__":
    sys.exit(main())
