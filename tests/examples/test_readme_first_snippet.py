"""The README's first service, copied literally into files and run as the README says, answers what it shows."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import httpx

from bastion._cli import main
from bastion.testing import TokenMinter
from tests.conftest import REPO, BastionProcess


def first_block(language: str) -> str:
    readme = (REPO / "README.md").read_text()
    match = re.search(rf"^```{language}\n(.*?)^```$", readme, flags=re.MULTILINE | re.DOTALL)
    assert match is not None, f"README has no {language} block"
    return match.group(1)


def test_the_first_service_answers_as_the_readme_shows(
    bastion_process: Callable[..., BastionProcess], tmp_path: Path
) -> None:
    (tmp_path / "mymodule.py").write_text(first_block("python"))
    (tmp_path / "service.toml").write_text(first_block("toml"))
    assert main(["dev-keys", "--dir", str(tmp_path / "keys")]) == 0
    process = bastion_process(
        "mymodule:service", "--app-dir", str(tmp_path), "--config", str(tmp_path / "service.toml")
    )
    token = TokenMinter.from_private_pem((tmp_path / "keys" / "jwt-private.pem").read_bytes()).mint(sub="alice")
    headers = {"Authorization": f"Bearer {token}"}
    response = httpx.get(f"{process.url}/api/v2/documents", params={"limit": 1}, headers=headers)
    assert (response.status_code, response.text) == (
        200,
        '{"items":[{"id":"doc-1","title":"Quarterly report"}],"total":2}',
    )
    assert f"# {response.text}\n" in (REPO / "README.md").read_text()  # the answer the README shows
    assert httpx.get(f"{process.url}/api/v1/documents", headers=headers).headers["deprecation"]
