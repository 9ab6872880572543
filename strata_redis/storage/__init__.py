"""Storage backends for checkpoint bytes: one small interface, a local and an S3 backend."""

from .base import Storage, as_byte_view, check_path
from .factory import open_storage, storage_from_env, storage_from_url
from .local import LocalStorage
from .s3 import S3Storage
from .transfer import part_size_for

__all__ = [
    "LocalStorage",
    "S3Storage",
    "Storage",
    "as_byte_view",
    "check_path",
    "open_storage",
    "part_size_for",
    "storage_from_env",
    "storage_from_url",
]
