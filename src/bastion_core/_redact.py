"""Secrets in what is printed or logged: a URL's password and query string are secrets too."""

from __future__ import annotations

import re

MASK = "***"
_USERINFO_PASSWORD = re.compile(r"^(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/@:]*:)[^/@]*@")
_USERINFO_TOKEN = re.compile(r"^(?P<head>[A-Za-z][A-Za-z0-9+.-]*://)[^/@:]+@")


def mask_url(url: str, *, cluster: bool = False) -> str:
    """``url`` with the userinfo password, a userinfo without a colon (a token: ``nats://TOKEN@host``) and the
    query replaced by ``***``.

    ``https://user:pw@host/x?token=t`` -> ``https://user:***@host/x?***``; ``nats://s3cret@host:4222`` ->
    ``nats://***@host:4222``. With ``cluster`` the value is a
    comma-separated list of URLs (a NATS cluster), masked one by one; otherwise a comma is part of the one URL
    (inside a password or a query it must not expose what follows). A string that is not a URL comes back
    unchanged.
    """
    if cluster:
        return ",".join(mask_url(part) for part in url.split(","))
    shown = _USERINFO_PASSWORD.sub(rf"\g<head>{MASK}@", url)
    shown = _USERINFO_TOKEN.sub(rf"\g<head>{MASK}@", shown)
    if "?" in shown:
        return shown.split("?", 1)[0] + "?" + MASK
    return shown
