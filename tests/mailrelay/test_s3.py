"""S3 delivery against a real S3 API server (moto): object keys, uploads, presigned URLs, outages."""

from __future__ import annotations

import datetime
import re
import urllib.parse
from typing import Any

import botocore.exceptions
import httpx
import pytest

from mailrelay._attachments import Attachment, DeliveryMode, inline_attachment
from mailrelay._errors import AttachmentStoreFailed
from mailrelay._parsing import MimePart
from mailrelay._s3 import S3Sink, content_disposition, make_client, object_key, sanitize_filename
from mailrelay.testing import free_port
from tests.mailrelay.servers import S3_REGION, S3Server, silent_tcp_server

UUID = "0c8f3a52-2b4e-4d6f-9b1a-5f0e6c7d8e9f"
NOON = datetime.datetime(2026, 3, 4, 12, 0, tzinfo=datetime.UTC).timestamp()


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("report.pdf", "report.pdf"),
        ("../../etc/passwd", "passwd"),
        ("C:\\Windows\\System32\\evil.dll", "evil.dll"),
        ("a\x00b.exe", "b.exe"),
        ("résumé final (2).pdf", "resume_final_2_.pdf"),
        ("...hidden", "hidden"),
        ("日本語", "attachment"),
        ("", "attachment"),
        (None, "attachment"),
        ("x" * 500 + ".tar.gz", "x" * 97 + ".gz"),
        ("y" * 500, "y" * 100),
    ],
)
def test_sanitize_filename(name: str | None, expected: str) -> None:
    assert sanitize_filename(name) == expected


def test_object_key_shape() -> None:
    when = datetime.datetime(2026, 3, 4, 23, 59, tzinfo=datetime.UTC)
    assert object_key("mail/in/", when=when, unique=UUID, filename="../x y.pdf") == f"mail/in/2026/03/04/{UUID}-x_y.pdf"


def test_content_disposition_downloads_and_keeps_the_name() -> None:
    assert content_disposition("ré sumé.pdf") == (
        "attachment; filename=\"re_sume.pdf\"; filename*=UTF-8''r%C3%A9%20sum%C3%A9.pdf"
    )
    assert content_disposition(None) == 'attachment; filename="attachment"'
    assert "\r" not in content_disposition("a\r\nX-Evil: 1.txt")


@pytest.fixture
def bucket(s3_server: S3Server, request: pytest.FixtureRequest) -> str:
    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:50].strip("-") + "-b"
    s3_server.client().create_bucket(Bucket=name)
    return name


def sink_for(server_url: str, bucket: str, **options: Any) -> S3Sink:
    timeout = options.pop("timeout", 5.0)
    client = make_client(endpoint_url=server_url, region=S3_REGION, timeout=timeout)
    return S3Sink(client=client, bucket=bucket, timeout=timeout, clock=lambda: NOON, **options)


@pytest.mark.usefixtures("aws_credentials")
async def test_upload_stores_the_bytes_under_an_unguessable_key(s3_server: S3Server, bucket: str) -> None:
    sink = sink_for(s3_server.url, bucket, prefix="mail/", new_id=lambda: UUID)
    part = MimePart(content_type="application/pdf", data=b"%PDF-1.7 bytes", filename="../Report 1.pdf", content_id="c1")
    (entry,) = await sink.store([part], delivery_id="d1")
    key = f"mail/2026/03/04/{UUID}-Report_1.pdf"
    assert entry == Attachment(
        content_type="application/pdf",
        size_bytes=14,
        delivery=DeliveryMode.S3,
        filename="../Report 1.pdf",
        content_id="c1",
        url=f"s3://{bucket}/{key}",
    )
    stored = s3_server.client().get_object(Bucket=bucket, Key=key)
    assert stored["Body"].read() == b"%PDF-1.7 bytes"
    assert stored["ContentType"] == "application/pdf"
    assert stored["ContentDisposition"] == "attachment; filename=\"Report_1.pdf\"; filename*=UTF-8''..%2FReport%201.pdf"
    assert stored["Metadata"] == {"delivery-id": "d1"}


@pytest.mark.usefixtures("aws_credentials")
async def test_presigned_url_downloads_with_a_plain_get(s3_server: S3Server, bucket: str) -> None:
    sink = sink_for(s3_server.url, bucket, presign_secs=300)
    (entry,) = await sink.store([MimePart(content_type="text/csv", data=b"a,b\n", filename="d.csv")], delivery_id="d")
    assert entry.presigned_url is not None
    url = urllib.parse.urlsplit(entry.presigned_url)
    query = dict(urllib.parse.parse_qsl(url.query))
    assert (url.scheme, url.netloc, url.path) == ("http", f"127.0.0.1:{s3_server.port}", "/" + (entry.url or "")[5:])
    assert (query["X-Amz-Expires"], query["X-Amz-Algorithm"]) == ("300", "AWS4-HMAC-SHA256")
    async with httpx.AsyncClient(timeout=10) as http:  # a plain GET: no AWS client, no credentials
        response = await http.get(entry.presigned_url)
    assert (response.status_code, response.content) == (200, b"a,b\n")


@pytest.mark.usefixtures("aws_credentials")
async def test_attachments_up_to_the_inline_limit_stay_inline(s3_server: S3Server, bucket: str) -> None:
    small, big = MimePart(content_type="a/b", data=b"x" * 10), MimePart(content_type="a/b", data=b"x" * 11)
    entries = await sink_for(s3_server.url, bucket, inline_max_bytes=10).store([small, big], delivery_id="d")
    assert entries[0] == inline_attachment(small)
    assert entries[1].delivery is DeliveryMode.S3


@pytest.mark.usefixtures("aws_credentials")
async def test_many_attachments_upload_in_parallel_in_order(s3_server: S3Server, bucket: str) -> None:
    parts = [MimePart(content_type="text/plain", data=f"{n}".encode(), filename=f"{n}.txt") for n in range(100)]
    entries = await sink_for(s3_server.url, bucket).store(parts, delivery_id="d")
    assert [e.filename for e in entries] == [f"{n}.txt" for n in range(100)]
    assert len({e.url for e in entries}) == 100
    client = s3_server.client()
    assert client.list_objects_v2(Bucket=bucket)["KeyCount"] == 100
    assert client.get_object(Bucket=bucket, Key=(entries[42].url or "").split("/", 3)[3])["Body"].read() == b"42"


class FailsFor:
    """The real client, except that PUT of one file name answers an S3 error."""

    def __init__(self, client: Any, filename: str) -> None:
        self.client = client
        self.filename = filename

    def put_object(self, **params: Any) -> Any:
        if params["Key"].endswith("-" + self.filename):
            raise botocore.exceptions.ClientError({"Error": {"Code": "SlowDown"}}, "PutObject")
        return self.client.put_object(**params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


@pytest.mark.usefixtures("aws_credentials")
async def test_one_failed_upload_removes_the_others_and_fails(s3_server: S3Server, bucket: str) -> None:
    client = make_client(endpoint_url=s3_server.url, region=S3_REGION, timeout=5)
    sink = S3Sink(client=FailsFor(client, "bad.txt"), bucket=bucket)  # type: ignore[arg-type]
    parts = [MimePart(content_type="text/plain", data=b"x", filename=name) for name in ("a.txt", "bad.txt", "c.txt")]
    with pytest.raises(AttachmentStoreFailed) as caught:
        await sink.store(parts, delivery_id="d")
    assert caught.value.reason == "S3 error SlowDown"
    assert s3_server.client().list_objects_v2(Bucket=bucket)["KeyCount"] == 0


@pytest.mark.usefixtures("aws_credentials")
async def test_discard_deletes_the_objects(s3_server: S3Server, bucket: str) -> None:
    sink = sink_for(s3_server.url, bucket)
    entries = await sink.store(
        [MimePart(content_type="a/b", data=b"1"), MimePart(content_type="a/b", data=b"2")], delivery_id="d"
    )
    await sink.discard([*entries, inline_attachment(MimePart(content_type="a/b", data=b"3"))])
    assert s3_server.client().list_objects_v2(Bucket=bucket)["KeyCount"] == 0


@pytest.mark.usefixtures("aws_credentials")
async def test_missing_bucket_fails(s3_server: S3Server) -> None:
    with pytest.raises(AttachmentStoreFailed) as caught:
        await sink_for(s3_server.url, "no-such-bucket").store(
            [MimePart(content_type="a/b", data=b"1")], delivery_id="d"
        )
    assert caught.value.reason == "S3 error NoSuchBucket"


@pytest.mark.usefixtures("aws_credentials")
async def test_s3_down_fails_with_a_connection_error() -> None:
    sink = sink_for(f"http://127.0.0.1:{free_port()}", "any-bucket", timeout=1.0)
    with pytest.raises(AttachmentStoreFailed) as caught:
        await sink.store([MimePart(content_type="a/b", data=b"1")], delivery_id="d")
    assert caught.value.reason == "connection error"


@pytest.mark.usefixtures("aws_credentials")
async def test_s3_that_never_answers_fails_with_a_timeout() -> None:
    with silent_tcp_server() as port:
        sink = sink_for(f"http://127.0.0.1:{port}", "any-bucket", timeout=0.5)
        with pytest.raises(AttachmentStoreFailed) as caught:
            await sink.store([MimePart(content_type="a/b", data=b"1")], delivery_id="d")
    assert caught.value.reason == "timeout"
