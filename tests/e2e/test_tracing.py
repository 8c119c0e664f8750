"""End to end: ``bastion run`` with ``[tracing]`` exports its spans over OTLP/HTTP to a local receiver, continuing the
callers' W3C traces on HTTP and on gRPC; the log lines of a request carry its trace id."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from bastion.testing import TokenMinter
from examples.documents_api.proto.documents.v1 import documents_pb2 as pb
from examples.documents_api.proto.documents.v1 import documents_pb2_grpc as pb_grpc
from tests.conftest import BastionProcess

EXAMPLE = ("examples.documents_api:service", "--config", "examples/documents_api/config.toml")
HTTP_TRACE, HTTP_PARENT = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
GRPC_TRACE, GRPC_PARENT = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"


class OtlpReceiver:
    """A collector's OTLP/HTTP traces endpoint: stores each export request, answers 200."""

    def __init__(self) -> None:
        self.exports: list[ExportTraceServiceRequest] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.exports.append(ExportTraceServiceRequest.FromString(body))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def spans(self) -> list[tuple[dict[str, Any], Any]]:
        """(resource attributes, span) for every span received."""
        found = []
        for export in self.exports:
            for resource_spans in export.resource_spans:
                resource = {kv.key: kv.value.string_value for kv in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    found.extend((resource, span) for span in scope_spans.spans)
        return found

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    yield receiver
    receiver.close()


def attributes(span: Any) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for kv in span.attributes:
        kind = kv.value.WhichOneof("value")
        values[kv.key] = getattr(kv.value, kind)
    return values


def test_http_and_grpc_spans_reach_the_collector(
    bastion_process: Callable[..., BastionProcess],
    key_env: dict[str, str],
    minter: TokenMinter,
    receiver: OtlpReceiver,
) -> None:
    process = bastion_process(*EXAMPLE, env={**key_env, "SERVICE_TRACING_ENDPOINT": receiver.url})
    token = minter.mint(sub="alice", roles=["user"])
    response = httpx.get(
        f"{process.url}/api/v2/documents",
        headers={"authorization": f"Bearer {token}", "traceparent": f"00-{HTTP_TRACE}-{HTTP_PARENT}-01"},
    )
    assert response.status_code == 200
    request_id = response.headers["x-request-id"]
    with grpc.insecure_channel(f"127.0.0.1:{process.port}") as channel:
        reply = pb_grpc.DocumentServiceStub(channel).ListDocuments(
            pb.ListDocumentsRequest(limit=1),
            metadata=[("authorization", f"Bearer {token}"), ("traceparent", f"00-{GRPC_TRACE}-{GRPC_PARENT}-01")],
            timeout=10,
        )
    assert len(reply.items) == 1
    assert process.stop() == 0  # SIGTERM: the batch of spans is exported at shutdown

    spans = {span.name: (resource, span) for resource, span in receiver.spans()}
    resource, http_span = spans["GET /api/v2/documents"]
    assert resource["service.name"] == "documents-api"
    assert (http_span.trace_id.hex(), http_span.parent_span_id.hex()) == (HTTP_TRACE, HTTP_PARENT)
    http_attributes = attributes(http_span)
    assert http_attributes["http.route"] == "/api/v2/documents"
    assert http_attributes["http.response.status_code"] == 200
    assert http_attributes["bastion.request_id"] == request_id
    assert http_attributes["bastion.token.outcome"] == "valid"
    assert http_attributes["bastion.policy.decision"] == "allow"
    _, grpc_span = spans["documents.v1.DocumentService/ListDocuments"]
    assert (grpc_span.trace_id.hex(), grpc_span.parent_span_id.hex()) == (GRPC_TRACE, GRPC_PARENT)
    grpc_attributes = attributes(grpc_span)
    assert grpc_attributes["rpc.system"] == "grpc"
    assert grpc_attributes["rpc.grpc.status_code"] == 0
    assert grpc_attributes["bastion.policy.decision"] == "allow"

    lines = [json.loads(line) for line in process.output().splitlines() if line.startswith("{")]
    request_lines = [line for line in lines if line.get("request_id") == request_id]
    assert [line["event"] for line in request_lines][-1] == "http_request"
    assert {line["trace_id"] for line in request_lines} == {HTTP_TRACE}


def test_a_malformed_traceparent_is_ignored(
    bastion_process: Callable[..., BastionProcess], key_env: dict[str, str], minter: TokenMinter, receiver: OtlpReceiver
) -> None:
    process = bastion_process(*EXAMPLE, env={**key_env, "SERVICE_TRACING_ENDPOINT": receiver.url})
    token = minter.mint(sub="alice", roles=["user"])
    response = httpx.get(
        f"{process.url}/api/v2/documents",
        headers={"authorization": f"Bearer {token}", "traceparent": f"00-{HTTP_TRACE}-zz-01"},
    )
    assert response.status_code == 200
    with grpc.insecure_channel(f"127.0.0.1:{process.port}") as channel:
        reply = pb_grpc.DocumentServiceStub(channel).ListDocuments(
            pb.ListDocumentsRequest(limit=1),
            metadata=[("authorization", f"Bearer {token}"), ("traceparent", "not-a-traceparent")],
            timeout=10,
        )
    assert len(reply.items) == 1
    assert process.stop() == 0
    received = {span.name: span for _, span in receiver.spans()}
    for name in ("GET /api/v2/documents", "documents.v1.DocumentService/ListDocuments"):
        assert received[name].parent_span_id == b""
        assert received[name].trace_id.hex() != HTTP_TRACE
