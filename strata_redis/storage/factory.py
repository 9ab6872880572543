"""Choosing a storage backend from a URL, a path or the environment (as the seeds do)."""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import Mapping
from typing import Any

from ..identity import checkpoint_dir
from .base import Storage, check_prefix
from .local import LocalStorage
from .s3 import S3Storage, check_bucket, check_endpoint_url

__all__ = ["open_storage", "storage_from_env", "storage_from_url"]

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")


def storage_from_url(url: str | os.PathLike[str], **s3_options: Any) -> Storage:
    """Return the storage a URL or path names.

    - ``s3://bucket`` or ``s3://bucket/prefix``: an :class:`S3Storage`; ``s3_options``
      (``region``, ``endpoint_url``, ``max_concurrency``, ...) go to it.
    - ``file:///abs/path`` (or ``file://localhost/...``, percent-decoded): a
      :class:`LocalStorage`.
    - any other text without ``scheme://``, or an ``os.PathLike``: a local path (``~`` is
      expanded, relative paths are made absolute).

    Raises:
        TypeError: ``url`` is neither text nor a path; ``s3_options`` given for a local path.
        ValueError: an unsupported scheme or a malformed URL, naming it.
    """
    if isinstance(url, os.PathLike):
        url = os.fspath(url)
    if not isinstance(url, str):
        raise TypeError(f"url must be a str or os.PathLike, got {type(url).__name__} {url!r}")
    if not url:
        raise ValueError("url must not be empty (s3://bucket/prefix, file:///path or a path)")
    match = _SCHEME.match(url)
    scheme = match.group(1).lower() if match else ""
    if scheme == "s3":
        bucket, prefix = _split_s3(url)
        return S3Storage(bucket, prefix=prefix, **s3_options)
    if s3_options:
        raise TypeError(f"S3 options {sorted(s3_options)} given for the local url {url!r}")
    if scheme == "file":
        return LocalStorage(_file_path(url))
    if scheme:
        raise ValueError(
            f"url {url!r} has the unsupported scheme {scheme!r}: use s3://bucket/prefix, "
            "file:///path or a plain path"
        )
    if "\x00" in url:
        raise ValueError(f"url {url!r} must not contain NUL")
    return LocalStorage(url)


def storage_from_env(environ: Mapping[str, str] | None = None) -> Storage:
    """Return the storage the environment names, as ``STORAGE_BACKEND`` and its variables say.

    - ``STORAGE_BACKEND``: ``local`` (the default) or ``s3``, any case.
    - local: ``LOCAL_STORAGE_PATH``, default the per-user ``identity.checkpoint_dir()``
      (``$XDG_DATA_HOME/strata_redis/checkpoints``, else
      ``~/.local/share/strata_redis/checkpoints``; logged once at WARNING), never the
      system temp dir: checkpoints outlive a reboot, and other users' runs never see them.
    - s3: ``CHECKPOINT_BUCKET`` (required; ``bucket`` or ``bucket/prefix``), ``AWS_REGION``,
      ``AWS_ENDPOINT_URL`` (MinIO and other S3-compatible servers); credentials from the
      standard AWS chain (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, profiles, roles).

    Args:
        environ: the variables to read; default ``os.environ``.

    Raises:
        ValueError: a missing or bad variable, naming it.
    """
    env = os.environ if environ is None else environ
    backend = env.get("STORAGE_BACKEND", "").strip().lower() or "local"
    if backend == "local":
        path = env.get("LOCAL_STORAGE_PATH") or checkpoint_dir(env)
        if "\x00" in path:
            raise ValueError(f"LOCAL_STORAGE_PATH must not contain NUL, got {path!r}")
        return LocalStorage(path)
    if backend != "s3":
        raise ValueError(f"STORAGE_BACKEND must be 'local' or 's3', got {env['STORAGE_BACKEND']!r}")
    spec = env.get("CHECKPOINT_BUCKET", "").strip()
    if not spec:
        raise ValueError("CHECKPOINT_BUCKET must name the bucket when STORAGE_BACKEND=s3")
    bucket, _, prefix = spec.removeprefix("s3://").partition("/")
    check_bucket(bucket, arg="CHECKPOINT_BUCKET")
    endpoint_url = env.get("AWS_ENDPOINT_URL") or None
    if endpoint_url is not None:
        check_endpoint_url(endpoint_url, arg="AWS_ENDPOINT_URL")
    region = env.get("AWS_REGION") or None
    if region is not None and not re.fullmatch(r"[a-z0-9-]+", region):
        raise ValueError(f"AWS_REGION must be a region name such as 'us-east-1', got {region!r}")
    check_prefix(prefix, arg="the prefix in CHECKPOINT_BUCKET")
    return S3Storage(bucket, region=region, endpoint_url=endpoint_url, prefix=prefix)


def open_storage(spec: Storage | str | os.PathLike[str] | None = None) -> Storage:
    """Return ``spec`` if it is a storage, else the storage its URL names, else the env's.

    Raises:
        TypeError, ValueError: as :func:`storage_from_url` and :func:`storage_from_env`.
    """
    if isinstance(spec, Storage):
        return spec
    if spec is None:
        return storage_from_env()
    return storage_from_url(spec)


def _split_s3(url: str) -> tuple[str, str]:
    parts = urllib.parse.urlsplit(url)
    if parts.query or parts.fragment or "@" in parts.netloc:
        raise ValueError(f"url {url!r} must be s3://bucket/prefix without query or user")
    try:
        bucket = check_bucket(parts.netloc, arg="the bucket of the url")
    except ValueError as exc:
        raise ValueError(f"url {url!r}: {exc}") from None
    return bucket, parts.path.lstrip("/")


def _file_path(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise ValueError(f"url {url!r} names the host {parts.netloc!r}; file:// URLs are local")
    if parts.query or parts.fragment:
        raise ValueError(f"url {url!r} must be file:///path without query or fragment")
    path = urllib.parse.unquote(parts.path)
    if not path.startswith("/") or "\x00" in path:
        raise ValueError(f"url {url!r} must be file:///absolute/path")
    return path
