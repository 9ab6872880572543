"""boto3 and botocore errors turned into StorageError: bucket and key named, no secrets."""

from __future__ import annotations

from ..errors import StorageError

__all__ = ["NOT_FOUND", "error_code", "storage_error"]

# The codes of "no such object"; a HEAD has no body, so only its status: "404".
NOT_FOUND = ("404", "NoSuchKey", "NotFound")
DENIED = ("403", "AccessDenied", "Forbidden", "InvalidAccessKeyId", "SignatureDoesNotMatch",
          "ExpiredToken", "InvalidToken", "InvalidClientTokenId", "AllAccessDisabled")  # fmt: skip


def error_code(exc: BaseException) -> str | None:
    """The S3 error code of a ``ClientError`` (``"404"`` for a bare HEAD), else None."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None
    code = response.get("Error", {}).get("Code")
    return str(code) if code is not None else None


def storage_error(
    exc: BaseException, *, op: str, path: str, backend: str, bucket: str, bucket_missing: bool
) -> StorageError:
    """A ``StorageError`` saying what failed and why, from a boto3/botocore/s3transfer error.

    The message holds the S3 error code and message (or the botocore error), never request
    headers or credentials; chain the original with ``raise ... from exc``.
    """
    where = f"{backend}: cannot {op} {path!r} (bucket {bucket!r})"
    code = error_code(exc)
    if bucket_missing or code == "NoSuchBucket":
        reason = f"the bucket {bucket!r} does not exist"
    elif code in DENIED:
        reason = (
            f"access denied ({code}: {_message(exc)}); check the AWS credentials and the "
            "bucket policy"
        )
    elif code is not None:
        reason = f"{code}: {_message(exc)}"
    elif type(exc).__name__ == "NoCredentialsError":
        reason = "no AWS credentials found (environment, shared config files or a role)"
    else:
        reason = f"{type(exc).__name__}: {exc}"
    return StorageError(f"{where}: {reason}", backend=backend, path=path)


def _message(exc: BaseException) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Message") or "no message")
