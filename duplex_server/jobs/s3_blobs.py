"""Media segments in an S3-compatible object store (``--media-dir s3://bucket/prefix``),
so that replicas on several hosts all read a session's audio.

The same contract as the filesystem :class:`~duplex_server.jobs.blobs.BlobStore`
(``SegmentBlobs`` in ``sessions/log/media.py``): a segment is named by the
SHA-256 of its bytes, under the same ``ab/abcdef...`` layout, so a media
folder copied into the bucket (``aws s3 sync DIR s3://bucket/prefix
--exclude 'tmp/*'``) reads the same. A put returns only once the store
acknowledged the PUT, which is what lets the store swap Redis's bulk for
references after it. A put always uploads, even where the key exists: the
same name means the same bytes, a duplicate is rare (a segment is a few
seconds of one session), and skipping it would cost a HEAD on every seal
or a conditional PUT that not every S3-compatible server implements (and
would race with retention deleting that same name).

A read checks the length and the digest: a missing or altered object is
:class:`BlobMissing`, so the session reports it by segment, never silently.
Everything else the client raises (no connection, a timeout, access
denied, the server's 5xx after boto3's retries) is :class:`ObjectStoreError`,
an ``OSError``, as a failing disk is for the folder: the sealer then leaves
the bulk in Redis, and a read reports the segment unavailable.

The endpoint, region, credentials and retries come from boto3's own chain
(``AWS_ENDPOINT_URL`` for an S3-compatible server, ``AWS_ACCESS_KEY_ID``,
``~/.aws/config``, an instance role). boto3 is imported only when an
``s3://`` media location is configured: ``pip install 'duplex-server[s3]'``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from duplex_server.jobs.blobs import BlobMissing, checked_digest, is_digest
from duplex_server.sessions.core.records import BlobRef

SCHEME = "s3://"
# A stuck object store must not hold the worker threads reads share for long.
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 30.0
POOL_CONNECTIONS = 32  # asyncio's default thread pool holds at most 32 threads
DELETE_BATCH = 1000  # the most keys one DeleteObjects request takes
LIST_PAGE = 1000  # the most keys one ListObjectsV2 reply holds
_MISSING = {"NoSuchKey", "404", "NotFound"}


class ObjectStoreError(OSError):
    """The object store could not be reached or refused the request."""


def parse_location(url: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` as (bucket, prefix without its slashes)."""
    parts = urlsplit(url)
    if parts.scheme != "s3" or not parts.netloc or parts.query or parts.fragment:
        raise ValueError(f"--media-dir {url!r}: an object store is s3://BUCKET[/PREFIX]")
    return parts.netloc, parts.path.strip("/")


class S3Blobs:
    """Content-addressed segments under ``prefix`` of ``bucket``. The client
    is thread-safe: puts and reads run on asyncio's worker threads."""

    def __init__(self, url: str, client: Any = None) -> None:
        self.bucket, self.prefix = parse_location(url)
        self._client = client if client is not None else _client()
        from botocore.exceptions import BotoCoreError, ClientError

        self._client_error = ClientError
        self._errors: tuple[type[Exception], ...] = (BotoCoreError, ClientError)

    def key(self, digest: str) -> str:
        name = f"{digest[:2]}/{checked_digest(digest)}"
        return f"{self.prefix}/{name}" if self.prefix else name

    def check_sync(self) -> None:
        """Refuse at start, not at the first seal: the bucket must answer."""
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except self._errors as exc:
            raise ObjectStoreError(f"s3://{self.bucket}: {exc}") from exc

    def put_sync(self, data: bytes, content_type: str) -> BlobRef:
        digest = hashlib.sha256(data).hexdigest()
        key = self.key(digest)
        try:
            self._client.put_object(
                Bucket=self.bucket, Key=key, Body=data, ContentType=content_type
            )
        except self._errors as exc:
            raise ObjectStoreError(f"s3://{self.bucket}/{key}: {exc}") from exc
        return BlobRef(digest, len(data), content_type)

    def read_sync(self, ref: BlobRef) -> bytes:
        key = self.key(ref.digest)
        try:
            data: bytes = self._client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except self._client_error as exc:
            if exc.response.get("Error", {}).get("Code") in _MISSING:
                raise BlobMissing(ref.digest) from None
            raise ObjectStoreError(f"s3://{self.bucket}/{key}: {exc}") from exc
        except self._errors as exc:  # no connection, a timeout, a body cut short
            raise ObjectStoreError(f"s3://{self.bucket}/{key}: {exc}") from exc
        if len(data) != ref.size or hashlib.sha256(data).hexdigest() != ref.digest:
            raise BlobMissing(f"{ref.digest}: the stored bytes do not match their name")
        return data

    def digests(self, after: str = "") -> Iterator[tuple[str, float]]:
        """Every object's digest and LastModified (the store's clock, in
        seconds since the epoch), in digest order from past ``after``: a
        page of ``LIST_PAGE`` at a time, fetched only as the caller reads
        on. A key not laid out as a blob's is no blob (never offered for deletion)."""
        start = {"StartAfter": self.key(after)} if after else {}
        pages = self._client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket,
            Prefix=f"{self.prefix}/" if self.prefix else "",
            PaginationConfig={"PageSize": LIST_PAGE},
            **start,
        )
        try:
            for page in pages:
                for listed in page.get("Contents", ()):
                    name = listed["Key"].rpartition("/")[2]
                    if is_digest(name) and listed["Key"] == self.key(name):  # else no segment
                        yield name, listed["LastModified"].timestamp()
        except self._errors as exc:
            raise ObjectStoreError(f"s3://{self.bucket}/{self.prefix}: {exc}") from exc

    def header_sync(self, digest: str, length: int) -> bytes:
        """An object's first ``length`` bytes (a ranged GET), unchecked: the
        orphan sweep reads only enough to attribute it."""
        key = self.key(digest)
        try:
            reply = self._client.get_object(
                Bucket=self.bucket, Key=key, Range=f"bytes=0-{length - 1}"
            )
            data: bytes = reply["Body"].read()
        except self._client_error as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code in _MISSING:
                raise BlobMissing(digest) from None
            if code == "InvalidRange":  # an empty object: no byte 0
                return b""
            raise ObjectStoreError(f"s3://{self.bucket}/{key}: {exc}") from exc
        except self._errors as exc:
            raise ObjectStoreError(f"s3://{self.bucket}/{key}: {exc}") from exc
        return data[:length]  # a server that ignores Range sends it all

    def delete_older_sync(self, digests: set[str], written_before: float) -> list[str]:
        """Delete the named objects still last written before ``written_before``,
        each asked again (HEAD) first: a put of the same bytes since (a
        session sealed again after a crash) keeps it. Not atomic as the
        folder's move aside is: a put landing between the HEAD and the
        delete (milliseconds, on an object an hour old) is not seen."""
        stale = set()
        for digest in digests:
            key = self.key(digest)
            try:
                head = self._client.head_object(Bucket=self.bucket, Key=key)
            except self._client_error as exc:
                if exc.response.get("Error", {}).get("Code") in _MISSING:
                    continue
                raise ObjectStoreError(f"s3://{self.bucket}/{key}: {exc}") from exc
            except self._errors as exc:
                raise ObjectStoreError(f"s3://{self.bucket}/{key}: {exc}") from exc
            if head["LastModified"].timestamp() < written_before:
                stale.add(digest)
        self.delete_sync(stale)
        return sorted(stale)

    def delete_sync(self, digests: set[str]) -> None:
        """Retention: the named objects gone (one already gone is no error)."""
        keys = [self.key(digest) for digest in sorted(digests)]
        for at in range(0, len(keys), DELETE_BATCH):
            batch = [{"Key": key} for key in keys[at : at + DELETE_BATCH]]
            try:
                done = self._client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True}
                )
            except self._errors as exc:
                raise ObjectStoreError(f"s3://{self.bucket}: {exc}") from exc
            if failed := done.get("Errors"):
                first = failed[0]
                raise ObjectStoreError(
                    f"s3://{self.bucket}/{first.get('Key')}: {first.get('Code')} "
                    f"{first.get('Message')} ({len(failed)} not deleted)"
                )


def _client() -> Any:
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise ValueError(
            "--media-dir s3://...: boto3 is not installed (pip install 'duplex-server[s3]')"
        ) from None
    config = Config(
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=READ_TIMEOUT_S,
        max_pool_connections=POOL_CONNECTIONS,
    )
    return boto3.session.Session().client("s3", config=config)
