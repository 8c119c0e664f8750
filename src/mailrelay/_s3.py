"""S3 attachment delivery: object keys, uploads on a bounded thread pool (boto3), presigned GET URLs.

boto3 is synchronous; each upload runs on one of `S3_WORKERS` threads of our own, bounded by botocore's connect
and read timeouts and by an overall deadline, so a slow or dead S3 never stalls the event loop or hangs a message.
"""

from __future__ import annotations

import asyncio
import datetime
import re
import time
import unicodedata
import urllib.parse
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import boto3
import botocore.config
import botocore.exceptions
import structlog

from mailrelay._attachments import Attachment, DeliveryMode, inline_attachment
from mailrelay._errors import AttachmentStoreFailed
from mailrelay._parsing import MimePart
from mailrelay._threads import BoundedExecutor

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

S3_WORKERS = 8  # uploads in flight at once, over all messages
S3_MAX_ATTEMPTS = 2  # botocore's attempts per request (the first and one retry); the sender retries the message
MAX_KEY_FILENAME = 100  # characters of the sanitized file name in a key (the extension is kept)
MAX_KEY_EXTENSION = 16
MAX_DISPOSITION_FILENAME = 255
FALLBACK_FILENAME = "attachment"
OCTET_STREAM = "application/octet-stream"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_CONTENT_TYPE = re.compile(r"^[a-z0-9!#$&^_.+-]+/[a-z0-9!#$&^_.+-]+$")

log = structlog.get_logger("mailrelay.s3")


def make_client(*, endpoint_url: str | None, region: str | None, timeout: float) -> S3Client:
    """A boto3 S3 client: credentials from the standard AWS chain, SigV4, path-style with an endpoint URL (MinIO
    and other S3-compatible servers), `timeout` for connecting and for each read, S3_MAX_ATTEMPTS attempts."""
    config = botocore.config.Config(
        region_name=region,
        signature_version="s3v4",
        s3={"addressing_style": "path" if endpoint_url else "auto"},
        connect_timeout=timeout,
        read_timeout=timeout,
        retries={"total_max_attempts": S3_MAX_ATTEMPTS, "mode": "standard"},
        max_pool_connections=S3_WORKERS,
        # checksums only where S3 requires them: S3-compatible servers do not all know the newer trailing ones
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    return boto3.session.Session().client("s3", endpoint_url=endpoint_url, region_name=region, config=config)


def has_credentials() -> bool:
    """Whether the standard AWS chain finds credentials (environment, shared files, container or instance role)."""
    return boto3.session.Session().get_credentials() is not None


def sanitize_filename(name: str | None) -> str:
    """A file name safe in a key and a URL: the last path component, ASCII letters, digits, `._-` (runs of others
    become `_`), no leading dot, at most MAX_KEY_FILENAME characters with the extension kept."""
    if not name:
        return FALLBACK_FILENAME
    base = re.split(r"[/\\\x00]", name)[-1]
    decomposed = unicodedata.normalize("NFKD", base)
    ascii_name = "".join(c for c in decomposed if not unicodedata.combining(c))
    cleaned = _UNSAFE.sub("_", ascii_name).lstrip(".")
    if len(cleaned) > MAX_KEY_FILENAME:
        stem, dot, extension = cleaned.rpartition(".")
        if dot and stem and len(extension) <= MAX_KEY_EXTENSION:
            cleaned = stem[: MAX_KEY_FILENAME - len(extension) - 1] + "." + extension
        else:
            cleaned = cleaned[:MAX_KEY_FILENAME]
    return cleaned if cleaned.strip("_") else FALLBACK_FILENAME


def object_key(prefix: str, *, when: datetime.datetime, unique: str, filename: str | None) -> str:
    """`<prefix><yyyy>/<mm>/<dd>/<uuid>-<sanitized filename>` (UTC date): unguessable and safe."""
    return f"{prefix}{when:%Y/%m/%d}/{unique}-{sanitize_filename(filename)}"


def content_disposition(filename: str | None) -> str:
    """`attachment` with the name (RFC 6266): a browser opening a presigned URL downloads, never renders."""
    safe = sanitize_filename(filename)
    if not filename:
        return f'attachment; filename="{safe}"'
    original = urllib.parse.quote(filename[:MAX_DISPOSITION_FILENAME], safe="")
    return f"attachment; filename=\"{safe}\"; filename*=UTF-8''{original}"


class S3Sink:
    """Implements AttachmentSink: uploads each part to `bucket` and describes it as `s3://<bucket>/<key>` (plus a
    presigned GET URL valid `presign_secs` when set). Parts up to `inline_max_bytes` stay inline.

    All parts of a message are uploaded concurrently (at most `workers` at a time for the whole relay); when any
    fails, the ones that made it are deleted again and AttachmentStoreFailed is raised.
    """

    def __init__(
        self,
        *,
        client: S3Client,
        bucket: str,
        prefix: str = "",
        presign_secs: int | None = None,
        inline_max_bytes: int | None = None,
        timeout: float = 30.0,
        workers: int = S3_WORKERS,
        clock: Callable[[], float] = time.time,
        new_id: Callable[[], str] = lambda: str(uuid.uuid4()),
    ) -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix
        self.presign_secs = presign_secs
        self.inline_max_bytes = inline_max_bytes
        # botocore bounds each attempt by `timeout`; this bounds the whole request with its retry and backoff
        self.request_budget = timeout * (S3_MAX_ATTEMPTS + 1)
        self._executor = BoundedExecutor(workers=workers, name="mailrelay-s3")
        self._clock = clock
        self._new_id = new_id

    async def store(self, parts: Sequence[MimePart], *, delivery_id: str) -> list[Attachment]:
        when = datetime.datetime.fromtimestamp(self._clock(), tz=datetime.UTC)
        jobs = [self._store_one(part, delivery_id=delivery_id, when=when) for part in parts]
        results = await asyncio.gather(*jobs, return_exceptions=True)
        stored = [r for r in results if isinstance(r, Attachment)]
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            await self.discard(stored)
            for failure in failures:
                if not isinstance(failure, Exception):
                    raise failure  # cancellation and the like go on up
            first = failures[0]
            raise first if isinstance(first, AttachmentStoreFailed) else AttachmentStoreFailed(_reason(first))
        return stored

    async def _store_one(self, part: MimePart, *, delivery_id: str, when: datetime.datetime) -> Attachment:
        if self.inline_max_bytes is not None and len(part.data) <= self.inline_max_bytes:
            return inline_attachment(part)
        url, presigned = await self._put(part, delivery_id=delivery_id, when=when)
        return Attachment(
            content_type=part.content_type,
            size_bytes=len(part.data),
            delivery=DeliveryMode.S3,
            filename=part.filename,
            content_id=part.content_id,
            url=url,
            presigned_url=presigned,
        )

    async def store_object(
        self, data: bytes, *, filename: str, content_type: str, delivery_id: str
    ) -> tuple[str, str | None]:
        """Upload one object named like an attachment (whatever `inline_max_bytes` says): its `s3://` URL and, with
        a presign lifetime, its presigned GET URL. AttachmentStoreFailed when the upload fails."""
        when = datetime.datetime.fromtimestamp(self._clock(), tz=datetime.UTC)
        part = MimePart(content_type=content_type, data=data, filename=filename)
        return await self._put(part, delivery_id=delivery_id, when=when)

    async def _put(self, part: MimePart, *, delivery_id: str, when: datetime.datetime) -> tuple[str, str | None]:
        key = object_key(self.prefix, when=when, unique=self._new_id(), filename=part.filename)
        try:
            presigned = await self._executor.run(self.request_budget, self._upload, part, key, delivery_id)
        except TimeoutError:
            raise AttachmentStoreFailed("timeout") from None
        except Exception as exc:
            raise AttachmentStoreFailed(_reason(exc)) from None
        return f"s3://{self.bucket}/{key}", presigned

    def _upload(self, part: MimePart, key: str, delivery_id: str) -> str | None:
        """PUT the object (blocking, on a worker thread); the presigned GET URL when a lifetime is set."""
        content_type = part.content_type if _CONTENT_TYPE.match(part.content_type) else OCTET_STREAM
        self.client.put_object(
            Bucket=self.bucket,
            Key=key,
            Body=part.data,
            ContentType=content_type,
            ContentDisposition=content_disposition(part.filename),
            Metadata={"delivery-id": delivery_id},
        )
        if self.presign_secs is None:
            return None
        return self.client.generate_presigned_url(
            "get_object", Params={"Bucket": self.bucket, "Key": key}, ExpiresIn=self.presign_secs
        )

    async def discard(self, attachments: Sequence[Attachment]) -> None:
        """Delete the S3 objects of `attachments`, best effort (a failure is logged, never raised)."""
        await self.discard_urls([a.url for a in attachments if a.url and a.delivery is DeliveryMode.S3])

    async def discard_urls(self, urls: Sequence[str]) -> None:
        """Delete the objects of these `s3://<bucket>/<key>` URLs, best effort (a failure is logged, never raised)."""
        prefix = f"s3://{self.bucket}/"
        for key in (url.removeprefix(prefix) for url in urls):
            try:
                await self._executor.run(self.request_budget, self._delete, key)
            except Exception as exc:
                log.warning("s3_discard_failed", key=key, error=_reason(exc))

    def _delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=key)

    def close(self) -> None:
        self._executor.close()


def _reason(exc: BaseException) -> str:
    """A short, secret-free reason for logs: `timeout`, `connection error`, `S3 error <Code>`, or the type name."""
    if isinstance(exc, TimeoutError | botocore.exceptions.ConnectTimeoutError | botocore.exceptions.ReadTimeoutError):
        return "timeout"
    if isinstance(exc, botocore.exceptions.EndpointConnectionError | botocore.exceptions.ConnectionClosedError):
        return "connection error"
    if isinstance(exc, botocore.exceptions.ClientError):
        code = str(exc.response.get("Error", {}).get("Code", "unknown"))
        return f"S3 error {code[:64]}"
    if isinstance(exc, botocore.exceptions.NoCredentialsError):
        return "no AWS credentials"
    if isinstance(exc, AttachmentStoreFailed):
        return exc.reason
    return type(exc).__name__
