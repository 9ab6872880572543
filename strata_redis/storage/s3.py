"""S3Storage: objects in an S3 bucket (or any S3-compatible server) through boto3."""

from __future__ import annotations

import contextlib
import datetime
import email.utils
import importlib
import io
import logging
import os
import re
import time
import urllib.parse
from collections.abc import Sequence
from typing import Any

from ..errors import StorageError, StorageExistsError, StorageNotFoundError
from ..validate import check_int, check_seconds
from .base import (
    MAX_PATH_BYTES,
    InUse,
    Storage,
    as_byte_view,
    check_path,
    check_prefix,
    check_range,
)
from .s3errors import NOT_FOUND, error_code, storage_error
from .transfer import (
    MAX_PART_SIZE,
    MAX_PUT_SIZE,
    MIN_PART_SIZE,
    ByteReader,
    ChunksReader,
    KnownObject,
    MiB,
    part_size_for,
)

__all__ = ["S3Storage", "check_bucket", "check_endpoint_url"]

log = logging.getLogger("strata_redis.storage")

_BUCKET = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{1,253}[A-Za-z0-9]")
_INSTALL_HINT = "S3Storage needs boto3, an optional dependency: pip install 'strata-redis[s3]'"
#: botocore's data loaders (its service models and endpoint data: JSON files of megabytes,
#: ~0.3 s to parse here) shared by this process's storages, by data path: a storage after
#: the first (a dataset's beside the checkpoints', a helper process's copy) parses none
_LOADERS: dict[str, Any] = {}


def check_bucket(value: object, *, arg: str = "bucket") -> str:
    """Return ``value`` if it looks like an S3 bucket name, else raise naming ``arg``."""
    if not isinstance(value, str):
        raise TypeError(f"{arg} must be a str, got {type(value).__name__} {value!r}")
    if not _BUCKET.fullmatch(value):
        raise ValueError(
            f"{arg} must be an S3 bucket name (3-255 letters, digits, '.', '-', '_'), got {value!r}"
        )
    return value


def check_endpoint_url(value: object, *, arg: str = "endpoint_url") -> str:
    """Return ``value`` if it is an ``http(s)://host[:port]`` URL without credentials."""
    if not isinstance(value, str):
        raise TypeError(f"{arg} must be a str, got {type(value).__name__}")
    try:
        url = urllib.parse.urlsplit(value)
        url.port  # noqa: B018 - parses the port, raising ValueError on a bad one
    except ValueError:
        url = None
    if url is None or url.scheme not in ("http", "https") or not url.hostname:
        raise ValueError(f"{arg} must be an http:// or https:// URL, got {value!r}")
    if url.username is not None or url.password is not None:
        # Refused rather than redacted: credentials come from the AWS chain only.
        raise ValueError(f"{arg} must not carry credentials; use the AWS credential chain")
    return value


class S3Storage(Storage):
    """Objects in an S3 bucket under an optional key prefix, through boto3.

    Objects of ``multipart_threshold`` bytes or more move as managed multipart transfers with
    ``max_concurrency`` threads: uploads of ``part_size`` parts (grown so no object needs
    more than 10,000), downloads as parallel ranged GETs pinned to one ETag. Smaller
    objects take one request.

    Credentials come only from the standard AWS chain (environment, shared files, instance or
    container roles); they are never arguments, never stored here, never in messages.
    Errors raise ``StorageError`` naming the bucket and key; a missing object raises
    ``StorageNotFoundError``; a missing bucket is a ``StorageError``, never "not found".

    Example::

        S3Storage("my-bucket-name", "us-east-1").read("checkpoints/latest.pt")

    Args:
        bucket: the bucket name.
        region: the AWS region; default ``AWS_REGION``, then the boto3 chain.
        endpoint_url: an S3-compatible server (MinIO, moto, ...); default
            ``AWS_ENDPOINT_URL_S3``, then ``AWS_ENDPOINT_URL``, then AWS. Path-style
            addressing is used with a custom endpoint unless ``addressing_style`` says otherwise.
        prefix: a key prefix under which every path lives (``"models/run-7"``).
        max_concurrency: threads per multipart transfer.
        multipart_threshold: objects of at least this many bytes go multipart.
        part_size: the multipart part size in bytes (at least 5 MiB), grown as needed.
        max_attempts: attempts per request, retries included (botocore "standard" mode).
        connect_timeout: seconds to connect.
        read_timeout: seconds to wait for a response.
        addressing_style: ``"path"``, ``"virtual"`` or ``"auto"``.

    Raises:
        ImportError: boto3 is not installed.
        TypeError, ValueError: a bad argument, naming it.
    """

    remote = True

    def __init__(
        self,
        bucket: str,
        region: str | None = None,
        endpoint_url: str | None = None,
        prefix: str = "",
        *,
        max_concurrency: int = 10,
        multipart_threshold: int = 16 * MiB,
        part_size: int = 16 * MiB,
        max_attempts: int = 5,
        connect_timeout: float = 10.0,
        read_timeout: float = 60.0,
        addressing_style: str | None = None,
    ) -> None:
        self._bucket = check_bucket(bucket)
        region = region or os.environ.get("AWS_REGION") or None
        if region is not None and not (isinstance(region, str) and region.isprintable()):
            raise ValueError(f"region must be a region name such as 'us-east-1', got {region!r}")
        if endpoint_url is None:
            for var in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
                if os.environ.get(var):
                    endpoint_url = check_endpoint_url(os.environ[var], arg=var)
                    break
        else:
            check_endpoint_url(endpoint_url)
        check_prefix(prefix)
        self._prefix = prefix.strip("/")
        self._base = self._prefix + "/" if self._prefix else ""
        self._max_concurrency = check_int("max_concurrency", max_concurrency, low=1, high=1024)
        self._threshold = check_int(
            "multipart_threshold", multipart_threshold, low=1, high=MAX_PUT_SIZE
        )
        self._part_size = check_int("part_size", part_size, low=MIN_PART_SIZE, high=MAX_PART_SIZE)
        check_int("max_attempts", max_attempts, low=1, high=100)
        check_seconds("connect_timeout", connect_timeout, high=3600)
        check_seconds("read_timeout", read_timeout, high=3600)
        style = addressing_style or ("path" if endpoint_url else "auto")
        if style not in ("path", "virtual", "auto"):
            raise ValueError(f"addressing_style must be path, virtual or auto, got {style!r}")
        self._options: dict[str, Any] = {
            "bucket": bucket, "region": region, "endpoint_url": endpoint_url, "prefix": prefix,
            "max_concurrency": max_concurrency, "multipart_threshold": multipart_threshold,
            "part_size": part_size, "max_attempts": max_attempts,
            "connect_timeout": connect_timeout, "read_timeout": read_timeout,
            "addressing_style": addressing_style,
        }  # fmt: skip

        try:
            import boto3
            from boto3.s3.transfer import TransferConfig, create_transfer_manager
            from botocore.config import Config
            from botocore.exceptions import BotoCoreError, ClientError
        except ImportError as exc:
            raise ImportError(_INSTALL_HINT) from exc
        # s3transfer ships no type hints; boto3 depends on it, so it is there.
        transfer_errors = importlib.import_module("s3transfer.exceptions")
        self._transfer_config_cls = TransferConfig
        self._create_transfer_manager = create_transfer_manager
        self._boto_errors: tuple[type[Exception], ...] = (
            ClientError,
            BotoCoreError,
            transfer_errors.RetriesExceededError,
            transfer_errors.S3UploadFailedError,
            transfer_errors.S3DownloadFailedError,
            boto3.exceptions.Boto3Error,
        )
        config = Config(
            retries={"total_max_attempts": max_attempts, "mode": "standard"},
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            max_pool_connections=max(10, max_concurrency + 2),
            s3={"addressing_style": style},
        )
        # A session of our own (boto3's default session is not thread-safe to create from),
        # with the process's shared data loader
        self._client: Any = _session(boto3).client(
            "s3", region_name=region, endpoint_url=endpoint_url, config=config
        )
        self._region: str | None = self._client.meta.region_name
        self._endpoint_url = endpoint_url
        self._bucket_seen = False

    # -- description, pickling ---------------------------------------------------------
    @property
    def bucket(self) -> str:
        """The bucket name."""
        return self._bucket

    @property
    def prefix(self) -> str:
        """The key prefix, without leading or trailing ``/`` (``""`` for none)."""
        return self._prefix

    def describe(self) -> str:
        """Return ``s3://<bucket>[/<prefix>]``."""
        return f"s3://{self._bucket}/{self._prefix}" if self._prefix else f"s3://{self._bucket}"

    def __repr__(self) -> str:
        return (
            f"S3Storage(bucket={self._bucket!r}, prefix={self._prefix!r}, "
            f"region={self._region!r}, endpoint_url={self._endpoint_url!r})"
        )

    def __getstate__(self) -> dict[str, Any]:
        return dict(self._options)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    def close(self) -> None:
        """Close the client's connection pool."""
        self._client.close()

    # -- the interface -----------------------------------------------------------------
    def write(self, path: str, data: object) -> None:
        """Store ``data`` at ``path`` (one PUT, or a multipart upload from the threshold up).

        S3 makes an object visible only once it is complete: a failed upload leaves the
        previous object (if any) and aborts its multipart upload.

        Raises:
            TypeError, ValueError: a bad path, a non-buffer ``data``, or over 5 TiB.
            StorageError: S3 refused or could not be reached.
        """
        path, key = self._key(path)
        view = as_byte_view(data)
        self._upload(path, key, data if type(data) is bytes else ByteReader(view), len(view))

    def write_chunks(self, path: str, chunks: Sequence[memoryview]) -> None:
        """Store the chunks one after the other at ``path``, as ``write`` does, read from
        where they are (no joined copy).

        Raises:
            TypeError, ValueError: a bad path, a non-buffer chunk, or over 5 TiB.
            StorageError: S3 refused or could not be reached.
        """
        path, key = self._key(path)
        views = [as_byte_view(chunk, arg="chunk") for chunk in chunks]
        self._upload(path, key, ChunksReader(views), sum(len(v) for v in views))

    def _upload(self, path: str, key: str, body: Any, size: int) -> None:
        """One PUT of ``body`` (``bytes`` or a seekable reader of ``size`` bytes), or a
        multipart upload from the threshold up."""
        config = self._transfer_config(size)  # refuses objects over 5 TiB
        before: set[str] | None = None
        try:
            if size < self._threshold:
                self._client.put_object(Bucket=self._bucket, Key=key, Body=body)
            else:
                if isinstance(body, bytes):
                    body = ByteReader(memoryview(body))
                # the uploads of this key open before ours are not ours to abort on failure
                before = self._open_uploads(key)
                self._client.upload_fileobj(body, self._bucket, key, Config=config)
        except self._boto_errors as exc:
            if before is not None:
                self._abort_uploads(key, before)
            raise self._error("write", path, exc) from exc
        except BaseException:  # interrupted (KeyboardInterrupt, a cancelled save)
            if before is not None:
                self._abort_uploads(key, before)
            raise

    def write_if_absent(self, path: str, data: object) -> None:
        """Store ``data`` at ``path`` with one conditional PUT (``If-None-Match: *``).

        The server must support conditional writes (AWS S3 since 2024, recent MinIO).

        Raises:
            StorageExistsError: an object already exists at ``path``; it is untouched.
            ValueError: ``data`` is over 5 GiB, the limit of a single PUT.
            StorageError: S3 refused or could not be reached.
        """
        path, key = self._key(path)
        view = as_byte_view(data)
        if len(view) > MAX_PUT_SIZE:
            raise ValueError(f"write_if_absent takes at most {MAX_PUT_SIZE} bytes of data")
        body = data if type(data) is bytes else ByteReader(view)
        for attempt in range(3):
            try:
                self._client.put_object(Bucket=self._bucket, Key=key, Body=body, IfNoneMatch="*")
                return
            except self._boto_errors as exc:
                code = error_code(exc)
                if code in ("PreconditionFailed", "412"):
                    raise StorageExistsError(
                        f"{self.describe()}: {path!r} already exists; it was not overwritten",
                        backend=self.describe(),
                        path=path,
                    ) from None
                # 409: a concurrent conditional write was in flight; S3 asks for a retry.
                if code != "ConditionalRequestConflict" or attempt == 2:
                    raise self._error("write", path, exc) from exc
                if isinstance(body, ByteReader):
                    body.seek(0)

    def read(self, path: str) -> bytes:
        """Return the whole object at ``path``: one GET below ``multipart_threshold`` bytes
        (a GET of that many first bytes is all of it); a larger one moves as parallel ranged
        GETs pinned to that first reply's ETag.

        Raises:
            StorageNotFoundError: no object at ``path``.
            StorageError: S3 refused, the bucket does not exist, or S3 could not be reached.
        """
        path, key = self._key(path)
        for attempt in range(3):
            try:
                try:
                    reply = self._client.get_object(
                        Bucket=self._bucket, Key=key, Range=f"bytes=0-{self._threshold - 1}"
                    )
                except self._boto_errors as exc:
                    if error_code(exc) != "InvalidRange":
                        raise
                    reply = None  # no first byte: an empty object
                if reply is None:
                    size = int(
                        self._client.head_object(Bucket=self._bucket, Key=key)["ContentLength"]
                    )
                    data = b""
                else:
                    size = _object_size(reply)
                    with reply["Body"] as stream:
                        if size <= self._threshold:
                            data = stream.read()
                    if size > self._threshold:
                        data = self._download(key, size, str(reply["ETag"]))
            except self._boto_errors as exc:
                if error_code(exc) in NOT_FOUND:
                    raise self._not_found("read", path) from None
                # 412: the object was replaced while its parts were read; read the new one.
                if error_code(exc) not in ("PreconditionFailed", "412") or attempt == 2:
                    raise self._error("read", path, exc) from exc
                continue
            if len(data) != size:
                raise StorageError(
                    f"{self.describe()}: short read of {path!r}: {len(data)} of {size} bytes",
                    backend=self.describe(),
                    path=path,
                )
            return data
        raise AssertionError("unreachable")  # pragma: no cover

    def read_range(self, path: str, start: int, length: int) -> bytes:
        """Return up to ``length`` bytes of the object at ``path`` from ``start``: one GET
        with a ``Range`` header (``length`` 0: a HEAD, to say whether it exists).

        Raises:
            StorageNotFoundError: no object at ``path``.
            StorageError: S3 refused, the bucket does not exist, or S3 could not be reached.
        """
        path, key = self._key(path)
        check_range(start, length)
        if length == 0:
            if not self.exists(path):
                raise self._not_found("read", path)
            return b""
        try:
            reply = self._client.get_object(
                Bucket=self._bucket, Key=key, Range=f"bytes={start}-{start + length - 1}"
            )
            with reply["Body"] as stream:
                data: bytes = stream.read()
        except self._boto_errors as exc:
            code = error_code(exc)
            if code in NOT_FOUND:
                raise self._not_found("read", path) from None
            if code in ("InvalidRange", "416"):  # the range starts at or past the end
                return b""
            raise self._error("read", path, exc) from exc
        return data

    def exists(self, path: str) -> bool:
        """Return whether an object exists at ``path`` (one HEAD request).

        Raises:
            StorageError: S3 refused, the bucket does not exist, or S3 could not be reached.
        """
        path, key = self._key(path)
        try:
            self._client.head_object(Bucket=self._bucket, Key=key)
        except self._boto_errors as exc:
            if error_code(exc) in NOT_FOUND:
                self._check_bucket_exists("stat", path)
                return False
            raise self._error("stat", path, exc) from exc
        return True

    def delete(self, path: str) -> None:
        """Delete the object at ``path``; a missing object is a no-op.

        Raises:
            StorageError: S3 refused, the bucket does not exist, or S3 could not be reached.
        """
        path, key = self._key(path)
        try:
            self._client.delete_object(Bucket=self._bucket, Key=key)
        except self._boto_errors as exc:
            raise self._error("delete", path, exc) from exc

    def list(self, prefix: str = "") -> list[str]:
        """Return the sorted paths (relative to the storage prefix) starting with ``prefix``.

        Raises:
            StorageError: S3 refused, the bucket does not exist, or S3 could not be reached.
        """
        prefix = check_prefix(prefix)
        found: list[str] = []
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self._bucket, Prefix=self._base + prefix
            )
            for page in pages:
                found.extend(obj["Key"][len(self._base) :] for obj in page.get("Contents", ()))
        except self._boto_errors as exc:
            raise self._error("list", prefix, exc) from exc
        found.sort()
        return found

    def remove_abandoned(
        self, prefix: str, older_than: float | None = None, *, in_use: InUse | None = None
    ) -> int:
        """Abort the incomplete multipart uploads under ``prefix``; return how many.

        A killed writer (or one whose own abort failed in an S3 outage) leaves its parts
        stored, and billed, until this runs or a bucket lifecycle rule
        (``AbortIncompleteMultipartUpload``) removes them. See ``Storage.remove_abandoned``.
        An upload's age is its ``Initiated`` time against the ``Date`` of S3's own reply,
        never this machine's clock: a client clock running fast would abort other writers'
        running uploads (this machine's clock only when the reply has no ``Date``).

        Raises:
            StorageError: S3 refused or could not be reached.
        """
        prefix = check_prefix(prefix)
        found: list[tuple[str, str]] = []  # (key, upload id) of the uploads old enough
        try:
            pages = self._client.get_paginator("list_multipart_uploads").paginate(
                Bucket=self._bucket, Prefix=self._base + prefix
            )
            for page in pages:
                cutoff = None if older_than is None else _server_time(page) - older_than
                for upload in page.get("Uploads", ()):
                    if cutoff is not None and _timestamp(upload.get("Initiated")) >= cutoff:
                        continue  # may still be running
                    found.append((upload["Key"], upload["UploadId"]))
            if found and in_use is not None:
                spared = set(in_use([key[len(self._base) :] for key, _ in found]))
                found = [(key, up) for key, up in found if key[len(self._base) :] not in spared]
            for key, upload_id in found:
                try:
                    self._client.abort_multipart_upload(
                        Bucket=self._bucket, Key=key, UploadId=upload_id
                    )
                except self._boto_errors as exc:
                    if error_code(exc) != "NoSuchUpload":  # finished or aborted meanwhile
                        raise
        except self._boto_errors as exc:
            raise self._error("remove abandoned uploads under", prefix, exc) from exc
        if found:
            log.info("%s: aborted %d abandoned multipart uploads under %r", self.describe(),
                     len(found), prefix)  # fmt: skip
        return len(found)

    # -- helpers -----------------------------------------------------------------------
    def _open_uploads(self, key: str) -> set[str]:
        """The ids of the incomplete multipart uploads of exactly ``key``."""
        reply = self._client.list_multipart_uploads(Bucket=self._bucket, Prefix=key)
        return {u["UploadId"] for u in reply.get("Uploads", ()) if u["Key"] == key}

    def _abort_uploads(self, key: str, before: set[str]) -> None:
        """Best effort after a failed or interrupted write: abort the upload it opened.

        The transfer manager aborts on most failures itself; this covers the rest (an
        interrupt, an abort that failed). What this cannot reach, ``remove_abandoned`` does.
        """
        with contextlib.suppress(*self._boto_errors):
            for upload_id in self._open_uploads(key) - before:
                with contextlib.suppress(*self._boto_errors):
                    self._client.abort_multipart_upload(
                        Bucket=self._bucket, Key=key, UploadId=upload_id
                    )

    def _key(self, path: str) -> tuple[str, str]:
        path = check_path(path)
        key = self._base + path
        if len(key.encode("utf-8")) > MAX_PATH_BYTES:
            raise ValueError(
                f"path {path!r} makes an S3 key longer than {MAX_PATH_BYTES} bytes with the "
                f"prefix {self._prefix!r}"
            )
        return path, key

    def _transfer_config(self, size: int) -> Any:
        return self._transfer_config_cls(
            multipart_threshold=self._threshold,
            multipart_chunksize=part_size_for(size, self._part_size),
            max_concurrency=self._max_concurrency,
            use_threads=self._max_concurrency > 1,
            preferred_transfer_client="classic",  # we rely on its seek-and-write downloads
        )

    def _download(self, key: str, size: int, etag: str) -> bytes:
        """Parallel ranged GETs, all pinned to one ETag, into one in-memory file."""
        # Not presized: growing costs page remaps, while zero-filling first costs a pass over
        # the memory (measured slower). getvalue() hands the buffer over without a copy.
        sink = io.BytesIO()
        known = KnownObject(size, etag)
        with self._create_transfer_manager(self._client, self._transfer_config(size)) as manager:
            manager.download(self._bucket, key, sink, subscribers=[known]).result()
        return sink.getvalue()

    def _check_bucket_exists(self, op: str, path: str) -> None:
        """After a bare 404 (a HEAD has no error code), tell a missing bucket from a key."""
        if self._bucket_seen:
            return
        try:
            self._client.head_bucket(Bucket=self._bucket)
        except self._boto_errors as exc:
            if error_code(exc) in NOT_FOUND:
                raise self._error(op, path, exc, bucket_missing=True) from exc
            return  # no permission to tell: the object is simply absent
        self._bucket_seen = True

    def _not_found(self, op: str, path: str) -> StorageError:
        self._check_bucket_exists(op, path)
        return StorageNotFoundError(
            f"{self.describe()}: no object at {path!r}", backend=self.describe(), path=path
        )

    def _error(
        self, op: str, path: str, exc: Exception, *, bucket_missing: bool = False
    ) -> StorageError:
        return storage_error(
            exc, op=op, path=path, backend=self.describe(), bucket=self._bucket,
            bucket_missing=bucket_missing,
        )  # fmt: skip


def _server_time(reply: dict[str, Any]) -> float:
    """S3's clock at ``reply``, seconds since the epoch: its HTTP ``Date`` header (this
    machine's clock when it has none, or one that does not parse)."""
    date = reply.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    if isinstance(date, str):
        try:  # "-0000" parses naive: UTC, as HTTP dates always are (_timestamp)
            return _timestamp(email.utils.parsedate_to_datetime(date))
        except (TypeError, ValueError):
            pass
    return time.time()


def _timestamp(value: object) -> float:
    """Seconds since the epoch of a boto3 timestamp (0 for none: counts as old)."""
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.timezone.utc)
        return value.timestamp()
    return 0.0


def _object_size(reply: dict[str, Any]) -> int:
    """The whole object's size from a ranged GET's reply (``Content-Range: bytes
    0-99/1000``), or its length when the server sent the whole object (no range)."""
    content_range = reply.get("ContentRange")
    if content_range:
        return int(str(content_range).rsplit("/", 1)[1])
    return int(reply["ContentLength"])


def _session(boto3: Any) -> Any:
    """A new boto3 session whose botocore data loader is the process's shared one for its
    data path (``AWS_DATA_PATH`` and the config's ``data_path`` are honoured). A loader
    caches what it parsed; two threads making the first storage at once may both parse it
    (no lock: a lock held across a fork would stop a child's first storage)."""
    import botocore.session
    from botocore.loaders import create_loader

    core = botocore.session.Session()
    path = core.get_config_variable("data_path") or ""
    loader = _LOADERS.get(path)
    if loader is None:
        loader = _LOADERS.setdefault(path, create_loader(path or None))
    core.register_component("data_loader", loader)
    return boto3.session.Session(botocore_session=core)
