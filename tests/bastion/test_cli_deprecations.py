"""``bastion deprecations report``: its bounds and errors against a loopback HTTP server."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bastion import _cli_deprecations
from bastion._cli import main

PAGE = (
    "# TYPE api_version_requests_total counter\n"
    'api_version_requests_total{version="v1",deprecated="true",replacement_version="v2"} 3.0\n'
    'api_version_requests_total{version="v2",deprecated="false",replacement_version=""} 9.0\n'
)


@pytest.fixture
def server() -> Iterator[tuple[str, dict[str, tuple[int, bytes]]]]:
    """A loopback server answering each path with the (status, body) put in the returned dict."""
    pages: dict[str, tuple[int, bytes]] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = pages.get(self.path, (404, b""))
            self.send_response(status)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", pages
    httpd.shutdown()
    httpd.server_close()
    thread.join(5)


def test_without_callers_the_report_says_they_were_not_recorded(
    server: tuple[str, dict[str, tuple[int, bytes]]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, pages = server
    pages["/metrics"] = (200, PAGE.encode())
    assert main(["deprecations", "report", "--metrics", url + "/metrics"]) == 0
    assert capsys.readouterr().out == (
        "v1 (deprecated, replacement v2): 3 requests from 1 callers\n           3  (not recorded)\n"
    )


def test_a_page_over_the_cap_is_one_error_line(
    server: tuple[str, dict[str, tuple[int, bytes]]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, pages = server
    monkeypatch.setattr(_cli_deprecations, "MAX_METRICS_BYTES", 100)
    pages["/metrics"] = (200, PAGE.encode())
    assert main(["deprecations", "report", "--metrics", url + "/metrics"]) == 2
    assert capsys.readouterr().err == f"error: --metrics '{url}/metrics' sent more than 100 bytes\n"


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        pytest.param(503, b"", "answered 503, expected 200", id="status"),
        pytest.param(
            200, b"api_version_requests_total{version= 1 2 3\n", "the metrics page is not Prometheus text", id="text"
        ),
    ],
)
def test_a_bad_page_is_one_error_line(
    server: tuple[str, dict[str, tuple[int, bytes]]],
    capsys: pytest.CaptureFixture[str],
    status: int,
    body: bytes,
    message: str,
) -> None:
    url, pages = server
    pages["/metrics"] = (status, body)
    assert main(["deprecations", "report", "--metrics", url + "/metrics"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
