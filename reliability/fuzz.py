"""Property-based fuzz targets (hypothesis, fixed example budgets) over the parsers an attacker reaches first.

Each target is a function ``(examples) -> FuzzResult``: it runs one hypothesis property with ``max_examples`` set
(no example database, no deadline: the figure is the number of examples, not their speed) and reports how many
examples ran and whether the stated invariant ever failed (hypothesis stops at the first failure and shrinks it;
the note then carries the falsifying example). ``tests/reliability/test_fuzz_*.py`` run each with a small budget
inside ``make test``; ``make reliability`` runs them with the full budget and puts the figures in the table.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import string
import tempfile
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reliability.figures import Figure, at_least, equals
from reliability.run import Context

EXAMPLE_CONFIG = Path(__file__).resolve().parent.parent / "examples" / "documents_api" / "config.toml"
QUICK_EXAMPLES = 60
FULL_EXAMPLES = 2_000


@dataclass(frozen=True, slots=True, kw_only=True)
class FuzzResult:
    target: str
    examples: int
    failure: str | None
    """None, or the error and the falsifying example hypothesis found."""

    def figures(self, budget: int) -> list[Figure]:
        scenario = f"fuzz {self.target}"
        return [
            at_least(scenario, "examples run", self.examples, budget),
            equals(
                scenario,
                "crashes / invariant failures",
                0 if self.failure is None else 1,
                0,
                note=(self.failure or "")[:200],
            ),
        ]


def _run(target: str, examples: int, strategy: st.SearchStrategy[Any], check: Callable[[Any], None]) -> FuzzResult:
    count = 0

    @settings(
        max_examples=examples, database=None, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
    )
    @given(strategy)
    def prop(value: Any) -> None:
        nonlocal count
        count += 1
        check(value)

    try:
        prop()
    except Exception as exc:  # the property failed: report it as the figure, with the example(s)
        found = list(exc.exceptions) if isinstance(exc, ExceptionGroup) else [exc]
        text = "; ".join(f"{type(e).__name__}: {e}".replace("\n", " ") for e in found)
        return FuzzResult(target=target, examples=count, failure=text)
    return FuzzResult(target=target, examples=count, failure=None)


class InProcessApp:
    """The secured example (its config.toml, token auth with a fresh key, revocation, Cedar policy) as an ASGI app
    on one event loop, lifespan started; ``request`` sends a raw path, so nothing client-side normalizes it."""

    def __init__(self, root: Path) -> None:
        from bastion import load_settings
        from bastion.testing import TokenMinter, write_dev_keys
        from bench.scenarios import LIMITS_NEVER_TRIP
        from examples.documents_api import service

        private, public = write_dev_keys(root)
        minter = TokenMinter.from_private_pem(private.read_bytes(), "RS256")
        self.user = minter.mint(sub="alice", roles=["user"], ttl=3600)
        self.admin = minter.mint(sub="root", roles=["admin"], ttl=3600)
        environ = {
            "SERVICE_TOKEN_PUBLIC_KEY_PATH": str(public),
            "SERVICE_POLICY_HOT_RELOAD": "false",
            "SERVICE_METRICS_ENABLED": "false",
            "SERVICE_GRPC_ENABLED": "false",
            "SERVICE_LOG_LEVEL": "error",
            "SERVICE_MIDDLEWARE_ACCESS_LOG_ENABLED": "false",
            **LIMITS_NEVER_TRIP,
        }
        self.app = service.build(load_settings(EXAMPLE_CONFIG, environ=environ))
        self.runner = asyncio.Runner()
        self._inbox: asyncio.Queue[dict[str, str]] | None = None
        self._lifespan: asyncio.Task[None] | None = None

    def __enter__(self) -> InProcessApp:
        self.runner.run(self._start())
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            self.runner.run(self._stop())
        self.runner.close()

    async def _start(self) -> None:
        self._inbox = asyncio.Queue()
        outbox: asyncio.Queue[dict[str, str]] = asyncio.Queue()
        scope = {"type": "lifespan", "state": {}}
        self._lifespan = asyncio.create_task(self.app(scope, self._inbox.get, outbox.put))  # type: ignore[arg-type]
        await self._inbox.put({"type": "lifespan.startup"})
        started = await outbox.get()
        if started["type"] != "lifespan.startup.complete":
            raise RuntimeError(f"the example did not start: {started}")

    async def _stop(self) -> None:
        assert self._inbox is not None and self._lifespan is not None
        await self._inbox.put({"type": "lifespan.shutdown"})
        await self._lifespan
        await self.app.aclose()

    def request(self, method: str, path: str, *, token: str | None = None, body: bytes = b"") -> int:
        """The status of one request; ``path`` goes into the scope as given (raw_path as its UTF-8 bytes)."""
        return self.runner.run(self._request(method, path, token, body))

    async def _request(self, method: str, path: str, token: str | None, body: bytes) -> int:
        headers = [
            (b"host", b"testserver"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        if token is not None:
            headers.append((b"authorization", b"Bearer " + token.encode("latin-1")))
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode("utf-8", "surrogateescape"),
            "query_string": b"",
            "root_path": "",
            "headers": headers,
            "client": ("127.0.0.1", 50000),
            "server": ("testserver", 80),
            "state": {},
        }
        sent = False
        status: list[int] = []

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.sleep(3600)
            return {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status.append(int(message["status"]))

        try:
            await self.app(scope, receive, send)
        except Exception:  # the server would answer 500 (uvicorn does when the app raises before a response)
            return 500
        return status[0] if status else 500


@contextlib.contextmanager
def example_app() -> Iterator[InProcessApp]:
    # The example logs every denial (audit events); thousands of them are not figures: captured and dropped.
    with (
        structlog.testing.capture_logs(),
        tempfile.TemporaryDirectory(prefix="reliability-fuzz-") as tmp,
        InProcessApp(Path(tmp)) as app,
    ):
        yield app


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


_json_scalar = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20))
_claims = st.dictionaries(
    st.sampled_from(["sub", "exp", "iat", "nbf", "jti", "roles", "aud", "iss", "perms", "client_id"])
    | st.text(max_size=8),
    _json_scalar | st.lists(_json_scalar, max_size=3),
    max_size=8,
)
_headers = st.fixed_dictionaries(
    {"alg": st.sampled_from(["none", "None", "HS256", "RS256", "ES256", "EdDSA", "", "rs256"]) | st.text(max_size=6)},
    optional={
        "typ": st.sampled_from(["JWT", "at+jwt"]),
        "kid": st.text(max_size=10),
        "crit": st.lists(st.text(max_size=5), max_size=2),
        "jku": st.just("http://127.0.0.1:1/jwks"),
    },
)
_segment = st.one_of(
    st.binary(max_size=64).map(_b64), st.text(string.ascii_letters + string.digits + "-_=+/.", max_size=40)
)
_jwt_shaped = st.tuples(
    _headers.map(lambda h: _b64(json.dumps(h).encode())), _claims.map(lambda c: _b64(json.dumps(c).encode())), _segment
).map(".".join)
_paseto_shaped = st.tuples(
    st.sampled_from(["v4.public.", "v4.local.", "v3.public.", "v2.local.", "v1.local.", "v4.public", "v9.x."]),
    st.binary(max_size=200).map(_b64),
    st.sampled_from(["", "." + _b64(b'{"kid":"x"}')]),
).map("".join)
_printable = st.text(string.printable.strip().replace("\x0b", "").replace("\x0c", ""), max_size=120)
TOKENS = st.one_of(_jwt_shaped, _paseto_shaped, _printable, st.tuples(_jwt_shaped, _segment).map(".".join))


def fuzz_tokens(examples: int) -> FuzzResult:
    """Random JWT- and PASETO-shaped bearer tokens on a protected route: always 401, never 5xx, never an allow."""
    with example_app() as app:

        def check(token: str) -> None:
            status = app.request("GET", "/api/v2/documents", token=token)
            assert status == 401, f"token {token!r} got {status}"

        return _run("token parsing", examples, TOKENS, check)


_SEGMENTS = [
    "api",
    "v1",
    "v2",
    "admin",
    "users",
    "documents",
    "alice",
    "doc-1",
    "..",
    ".",
    "",
    "%2e%2e",
    "%2F",
    "ADMIN",
    "users;x",
    "users%00",
    "openapi.json",
    "\\",
    "..%2f",
    "health",
    "ready",
]
PATHS = st.lists(st.sampled_from(_SEGMENTS) | st.text(max_size=6), min_size=1, max_size=9).map(
    lambda parts: "/" + "/".join(parts)
)
PROTECTED = {"/api/v1/admin/users", "/api/v2/admin/users"}


def fuzz_paths(examples: int) -> FuzzResult:
    """Path tricks: canonicalization is idempotent and yields one clean absolute path; a path that canonicalizes to
    an admin-only route is never allowed for a plain user; no path gives a 5xx."""
    from bastion.errors import BadRequest
    from bastion.routing._paths import canonical_path

    with example_app() as app:

        def check(path: str) -> None:
            try:
                once = canonical_path(path)
            except BadRequest:
                once = None
            if once is not None:
                assert canonical_path(once) == once, f"not idempotent: {path!r} -> {once!r}"
                assert once.startswith("/") and "//" not in once, f"{path!r} -> {once!r}"
                assert all(part not in (".", "..") for part in once.split("/")), f"{path!r} -> {once!r}"
            status = app.request("GET", path, token=app.user)
            assert status < 500, f"{path!r} got {status}"
            if once in PROTECTED or (once is not None and once.rstrip("/") in PROTECTED):
                assert status in (401, 403, 404, 307, 308), f"user reached admin route via {path!r}: {status}"

        return _run("path canonicalization", examples, PATHS, check)


_METHODS = st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "TRACE", "get", "X-ODD"])
_WEIRD = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="/?#"), max_size=12)
ACTIONS = st.tuples(
    _METHODS, st.lists(st.sampled_from(_SEGMENTS) | _WEIRD, min_size=1, max_size=6), st.binary(max_size=64)
)


def fuzz_actions(examples: int) -> FuzzResult:
    """Cedar action building: any method, any path (quotes, backslashes, braces, unicode) and any body through the
    policy layer as a plain user: never a 5xx (an action string never breaks the Cedar request), never an allow of
    an admin-only route, and the default normalizer keeps the segment count."""
    from bastion.policy._normalize import default_normalizer

    with example_app() as app:

        def check(value: tuple[str, list[str], bytes]) -> None:
            method, parts, body = value
            path = "/" + "/".join(parts)
            normalized = default_normalizer(path)
            assert normalized.count("/") == path.count("/"), f"{path!r} -> {normalized!r}"
            assert default_normalizer(normalized) == normalized
            status = app.request(method, path, token=app.user, body=body)
            assert status < 500, f"{method} {path!r} got {status}"
            if path in PROTECTED:
                assert status != 200, f"{method} {path!r} allowed for a user"

        return _run("Cedar action building", examples, ACTIONS, check)


_RULE_SEGMENT = st.sampled_from(["api", "v1", "v2", "documents", "users", "*", "**", "{id}", "x"])
_RULE = st.tuples(st.sampled_from([None, "GET", "POST"]), st.lists(_RULE_SEGMENT, min_size=1, max_size=4))
_REQUEST = st.tuples(
    st.sampled_from(["GET", "POST", "HEAD", "PUT"]),
    st.lists(
        st.sampled_from(
            ["api", "v1", "v2", "documents", "users", "x", "42", "y", "3f2b8c1e-0000-4000-8000-000000000000"]
        ),
        max_size=6,
    ),
)
RULES = st.tuples(st.lists(_RULE, max_size=8), st.lists(_REQUEST, min_size=1, max_size=8))


def _reference_matches(segments: tuple[str, ...], pattern: tuple[str, ...]) -> bool:
    """The spec's wildcards, tried by brute force: ``*`` is one segment, ``**`` any number (zero included)."""
    if not pattern:
        return not segments
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(_reference_matches(segments[i:], rest) for i in range(len(segments) + 1))
    return bool(segments) and head in ("*", segments[0]) and _reference_matches(segments[1:], rest)


def fuzz_route_rules(examples: int) -> FuzzResult:
    """Route-rule matching against a brute-force reference (every rule tried, the spec's priority order:
    method-prefixed exact, exact path, then the most specific wildcard): the same rule for every request."""
    from bastion.ratelimit import Quota
    from bastion.ratelimit._rules import RouteRule, RouteRules, canonical_name, parse_pattern, path_segments
    from bastion_core import ConfigError

    def check(value: tuple[list[tuple[str | None, list[str]]], list[tuple[str, list[str]]]]) -> None:
        raw_rules, requests = value
        rules: dict[str, RouteRule] = {}
        for method, parts in raw_rules:
            pattern = (f"{method} " if method else "") + "/" + "/".join(parts)
            try:
                parsed_method, segments = parse_pattern(pattern)
            except ConfigError:
                continue
            name = canonical_name(parsed_method, segments)
            rules[name] = RouteRule(name=name, method=parsed_method, segments=segments, quota=Quota.per_minute(10))
        compiled = RouteRules(rules.values())
        for method, parts in requests:
            path = "/" + "/".join(parts)
            segments = path_segments(path)
            candidates = [
                r
                for r in rules.values()
                if r.method in (None, method) or (method == "HEAD" and r.method == "GET")
                if _reference_matches(segments, r.segments)
            ]
            exact = [r for r in candidates if r.exact]
            expected: RouteRule | None
            if exact:
                expected = min(exact, key=lambda r: (r.method is None, r.method != method))
            else:
                wild = [r for r in candidates if not r.exact]
                # a HEAD rule at the same node shadows the GET one for HEAD requests (GET serves HEAD otherwise)
                expected = min(wild, key=lambda r: (r.rank, r.method != method), default=None)
            got = compiled.match(method, path)
            assert (got and got.name) == (expected and expected.name), (
                f"{method} {path}: {got and got.name} != {expected and expected.name}"
            )

    return _run("route-rule matching", examples, RULES, check)


_SMTP_ADDR = st.one_of(
    st.text(max_size=40),
    st.tuples(
        st.text(string.ascii_letters + '.-_+"\\ ', max_size=12), st.text(string.ascii_letters + ".-[]:", max_size=12)
    ).map(lambda p: f"<{p[0]}@{p[1]}>"),
    st.sampled_from(
        ["<>", "<@a,@b:c@d>", "<a@b> SIZE=10", "<a@b> BODY=8BITMIME SMTPUTF8", '<"a b"@c>', "<a@[1.2.3.4]>"]
    ),
)
SMTP_LINES = st.tuples(
    st.sampled_from(["FROM:", "TO:", "from:", "FROM: ", ""]), _SMTP_ADDR, st.lists(st.text(max_size=15), max_size=3)
)


def fuzz_smtp_commands(examples: int) -> FuzzResult:
    """MAIL/RCPT argument parsing: never raises; an address it returns holds no CR, LF or NUL (nothing can be
    smuggled into the payload or a log line); parameter checks answer None or a 5xx reply."""
    from mailrelay.smtp._paths import check_mail_parameters, parse_path, printable_domain, strip_keyword

    def check(value: tuple[str, str, list[str]]) -> None:
        keyword, address, params = value
        arg = strip_keyword("FROM:", keyword + address)
        if arg is None:
            return
        parsed, rest = parse_path(arg)
        if parsed is not None:
            assert not any(c in parsed for c in "\r\n\x00"), f"{arg!r} -> {parsed!r}"
            assert rest is not None
        reply = check_mail_parameters(params, max_message_size=1_000_000)
        assert reply is None or 500 <= reply.code < 600, reply
        domain = printable_domain(address)
        assert domain.isprintable() and len(domain) <= 255

    return _run("SMTP command parsing", examples, SMTP_LINES, check)


_HEADER = st.tuples(
    st.sampled_from(
        [
            "Subject",
            "From",
            "Content-Type",
            "Content-Transfer-Encoding",
            "Content-Disposition",
            "MIME-Version",
            "X-Custom",
        ]
    ),
    st.one_of(
        st.text(max_size=60),
        st.sampled_from(
            [
                "multipart/mixed; boundary=b",
                'multipart/alternative; boundary="b"',
                "text/html; charset=x-bad",
                "text/plain; charset=utf-7",
                "base64",
                "quoted-printable",
                "attachment; filename*=utf-8''%ff%fe",
                "=?utf-8?b?////?=",
                "=?x-unknown?q?=FF?=",
                "message/rfc822",
                "application/octet-stream; name=a.exe",
            ]
        ),
    ),
)
_PART = st.tuples(st.lists(_HEADER, max_size=4), st.binary(max_size=200))
MIME = st.one_of(
    st.binary(max_size=2_000),
    st.tuples(st.lists(_HEADER, max_size=6), st.lists(_PART, max_size=4), st.binary(max_size=100)).map(
        lambda m: (
            "".join(f"{n}: {v}\r\n" for n, v in m[0]).encode("utf-8", "surrogateescape")
            + b"\r\n"
            + b"".join(
                b"--b\r\n"
                + "".join(f"{n}: {v}\r\n" for n, v in h).encode("utf-8", "surrogateescape")
                + b"\r\n"
                + body
                + b"\r\n"
                for h, body in m[1]
            )
            + b"--b--\r\n"
            + m[2]
        )
    ),
)


def fuzz_mime(examples: int) -> FuzzResult:
    """MIME parsing of arbitrary and MIME-shaped bytes: never raises; every text field is JSON-safe (encodes to
    UTF-8, no lone surrogate) and every attachment's data is bytes. (A NUL in a body passes through: JSON carries
    it as \\u0000.)"""
    from mailrelay._parsing import parse_message

    def check(raw: bytes) -> None:
        parsed = parse_message(raw)
        texts = [parsed.subject, parsed.sender_name, parsed.from_address, parsed.text_body, parsed.html_body]
        texts += [t for pair in parsed.headers for t in pair]
        for text in texts:
            if text is not None:
                text.encode("utf-8")
        json.dumps([t for t in texts if t is not None])
        assert all(isinstance(part.data, bytes) for part in parsed.parts)

    return _run("MIME parsing", examples, MIME, check)


TARGETS: dict[str, Callable[[int], FuzzResult]] = {
    "tokens": fuzz_tokens,
    "paths": fuzz_paths,
    "actions": fuzz_actions,
    "route-rules": fuzz_route_rules,
    "smtp-commands": fuzz_smtp_commands,
    "mime": fuzz_mime,
}


def _scenario(target: str) -> Callable[[Context], list[Figure]]:
    def run(ctx: Context) -> list[Figure]:
        budget = QUICK_EXAMPLES if ctx.quick else FULL_EXAMPLES
        return TARGETS[target](budget).figures(budget)

    return run


SCENARIOS = {f"fuzz-{target}": _scenario(target) for target in TARGETS}
