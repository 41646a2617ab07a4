"""Media segments in an S3-compatible object store (issue 41,
``--media-dir s3://bucket/prefix``), against a real S3 server (moto's server
mode on a local port): a segment is written once the PUT is acknowledged,
named by its SHA-256; a missing or altered object is reported, never
replaced; an unreachable store leaves the bulk in Redis; and another
replica, with its own client, reads a session's audio back whole."""

from __future__ import annotations

import contextlib
import hashlib
import socket
import uuid
from collections.abc import Iterator

import boto3
import pytest
import redis as redis_client
from moto.server import ThreadedMotoServer

from duplex_server.app import media_blobs
from duplex_server.jobs.blobs import BlobMissing
from duplex_server.jobs.s3_blobs import ObjectStoreError, S3Blobs
from duplex_server.sessions.core.records import BlobRef
from duplex_server.sessions.log.media import SEGMENT_TYPE, MediaUnavailable
from duplex_server.sessions.log.redis_store import RedisLog
from tests.test_media_segments import _conversation

BUCKET = "media"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def s3_env(endpoint: str, tmp_path) -> dict[str, str]:
    """What a server on another host is given: boto3's own variables only."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        # the machine's own ~/.aws must not decide the test
        "AWS_CONFIG_FILE": str(tmp_path / "aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "aws-credentials"),
    }


@contextlib.contextmanager
def s3_server() -> Iterator[str]:
    """A real S3-compatible server on a free local port, with ``BUCKET``."""
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        ).create_bucket(Bucket=BUCKET)
        yield endpoint
    finally:
        server.stop()


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with s3_server() as endpoint:
        yield endpoint


@pytest.fixture
def s3(s3_endpoint, tmp_path, monkeypatch):
    """The S3 variables set as a deployment sets them; the bucket's own client."""
    for name, value in s3_env(s3_endpoint, tmp_path).items():
        monkeypatch.setenv(name, value)
    return boto3.client("s3")


@pytest.fixture
def location() -> str:
    return f"s3://{BUCKET}/t{uuid.uuid4().hex[:10]}"


def test_a_segment_is_stored_under_its_digest_and_read_back(s3, location):
    blobs = S3Blobs(location)
    data = bytes(range(256)) * 40
    ref = blobs.put_sync(data, SEGMENT_TYPE)
    digest = hashlib.sha256(data).hexdigest()
    assert ref == BlobRef(digest, len(data), SEGMENT_TYPE)
    prefix = location.removeprefix(f"s3://{BUCKET}/")
    key = f"{prefix}/{digest[:2]}/{digest}"  # the media folder's own layout
    assert s3.get_object(Bucket=BUCKET, Key=key)["Body"].read() == data
    assert blobs.put_sync(data, SEGMENT_TYPE) == ref  # the same bytes: the same name
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{prefix}/")["Contents"]
    assert [o["Key"] for o in listed] == [key]
    # another client (another host) reads it, checked
    assert S3Blobs(location).read_sync(ref) == data


def test_a_missing_object_is_blob_missing(s3, location):
    blobs = S3Blobs(location)
    never = b"never stored"
    ref = BlobRef(hashlib.sha256(never).hexdigest(), len(never), SEGMENT_TYPE)
    with pytest.raises(BlobMissing, match=ref.digest):
        blobs.read_sync(ref)


@pytest.mark.parametrize("damage", ["altered", "shortened"])
def test_an_altered_object_is_blob_missing(s3, location, damage):
    blobs = S3Blobs(location)
    data = b"\x01\x02" * 5000
    ref = blobs.put_sync(data, SEGMENT_TYPE)
    bad = b"x" + data[1:] if damage == "altered" else data[:-1]
    s3.put_object(Bucket=BUCKET, Key=blobs.key(ref.digest), Body=bad)
    with pytest.raises(BlobMissing, match="do not match"):
        S3Blobs(location).read_sync(ref)


def test_deleted_objects_are_gone_and_the_rest_stay(s3, location):
    blobs = S3Blobs(location)
    kept, dropped = (blobs.put_sync(data, SEGMENT_TYPE) for data in (b"kept", b"dropped"))
    never = hashlib.sha256(b"never stored").hexdigest()
    blobs.delete_sync({dropped.digest, never})  # one never stored: no error
    with pytest.raises(BlobMissing):
        blobs.read_sync(dropped)
    assert blobs.read_sync(kept) == b"kept"
    blobs.delete_sync(set())


def test_an_unreachable_store_is_an_os_error(s3, location, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_free_port()}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    blobs = S3Blobs(location)
    with pytest.raises(ObjectStoreError) as failed:
        blobs.put_sync(b"audio", SEGMENT_TYPE)
    assert isinstance(failed.value, OSError)  # what the sealer leaves the bulk in Redis on
    ref = BlobRef(hashlib.sha256(b"audio").hexdigest(), 5, SEGMENT_TYPE)
    with pytest.raises(ObjectStoreError):
        blobs.read_sync(ref)
    with pytest.raises(ObjectStoreError):
        blobs.delete_sync({ref.digest})
    with pytest.raises(ValueError, match="--media-dir"):  # refused at start
        media_blobs(location)


def test_a_bucket_that_does_not_exist_is_refused_at_start(s3):
    with pytest.raises(ValueError, match="no-such-bucket"):
        media_blobs("s3://no-such-bucket/p")
    assert isinstance(media_blobs(f"s3://{BUCKET}"), S3Blobs)  # no prefix: the bucket's root


@pytest.mark.parametrize("bad", ["s3://", "s3:///prefix", "s3://b/p?x=1"])
def test_a_malformed_location_is_refused(bad):
    with pytest.raises(ValueError, match="s3://BUCKET"):
        S3Blobs(bad)


# --- a Redis session's media in the bucket --------------------------------


def _log(redis_server, prefix: str, location: str) -> RedisLog:
    return RedisLog(redis_server.url, prefix=prefix, media=S3Blobs(location))


def _bulk_fields(redis_server, prefix: str) -> set[bytes]:
    return set(redis_client.Redis.from_url(redis_server.url).hkeys(f"{prefix}:{{s}}:bulk"))


async def _appended(log: RedisLog, turns: int):
    await log.create("s")
    fence = await log.acquire_lease("s", "me")
    records = _conversation(turns=turns)
    for at in range(0, len(records), 4):  # batches, as a session appends them
        await log.append("s", records[at : at + 4], fence)
    return records


async def test_another_replica_reads_a_session_sealed_into_the_bucket(redis_server, s3, location):
    prefix = f"m{uuid.uuid4().hex[:10]}"
    log = _log(redis_server, prefix, location)
    records = await _appended(log, turns=10)
    await log.seal_media()
    fields = _bulk_fields(redis_server, prefix)
    assert fields and all(name[:1] in b"AOU" for name in fields), sorted(fields)[:5]
    stored = _objects(s3, location)
    assert stored["KeyCount"] >= 1
    await log.close()
    # another replica: its own client, its own (empty) segment cache
    other = _log(redis_server, prefix, location)
    assert await other.read("s") == records
    assert await other.read("s", after_seq=30) == records[30:]
    await other.close()


def _objects(s3, location: str) -> dict:
    """The bucket's listing of what lies under ``location``'s prefix."""
    return s3.list_objects_v2(Bucket=BUCKET, Prefix=location.removeprefix(f"s3://{BUCKET}/") + "/")


async def test_a_segment_altered_in_the_bucket_is_reported_by_name(redis_server, s3, location):
    prefix = f"m{uuid.uuid4().hex[:10]}"
    log = _log(redis_server, prefix, location)
    await _appended(log, turns=1)
    await log.seal_media()
    await log.close()
    listed = _objects(s3, location)
    (obj,) = listed["Contents"]
    segment = s3.get_object(Bucket=BUCKET, Key=obj["Key"])["Body"].read()
    altered = bytes([segment[0] ^ 1]) + segment[1:]  # same length: only the digest tells
    s3.put_object(Bucket=BUCKET, Key=obj["Key"], Body=altered)
    fresh = _log(redis_server, prefix, location)
    with pytest.raises(MediaUnavailable, match=obj["Key"].rsplit("/", 1)[1]):
        await fresh.read("s")
    await fresh.close()


async def test_an_unreachable_store_leaves_the_bulk_in_redis(
    redis_server, s3, location, monkeypatch
):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_free_port()}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    prefix = f"m{uuid.uuid4().hex[:10]}"
    log = _log(redis_server, prefix, location)
    records = await _appended(log, turns=1)
    await log.seal_media()
    fields = _bulk_fields(redis_server, prefix)
    assert fields and all(name[:1] in b"aou" for name in fields), sorted(fields)[:5]
    assert await log.read("s") == records
    await log.close()


async def test_a_deleted_session_leaves_no_object_in_the_bucket(redis_server, s3, location):
    prefix = f"m{uuid.uuid4().hex[:10]}"
    log = _log(redis_server, prefix, location)
    await _appended(log, turns=4)
    await log.seal_media()
    assert _objects(s3, location)["KeyCount"] >= 1
    await log.delete("s")
    assert _objects(s3, location)["KeyCount"] == 0
    await log.close()
