"""Storage backends for checkpoint bytes: one small interface, a local and an S3 backend.

``__all__`` is what other packages and users may import from here: the interface and its two
backends, choosing one by URL or environment, and the helpers a backend of one's own needs
(``check_path``, ``as_byte_view``, ``part_size_for``, ``InUse``), and ``retrying`` and
``retry_call``: a read sent again through a storage outage.
"""

from .base import InUse, Storage, as_byte_view, check_path
from .factory import open_storage, storage_from_env, storage_from_url
from .local import LocalStorage
from .outage import retry_call, retrying
from .s3 import S3Storage
from .transfer import part_size_for

__all__ = [
    "InUse",
    "LocalStorage",
    "S3Storage",
    "Storage",
    "as_byte_view",
    "check_path",
    "open_storage",
    "part_size_for",
    "retry_call",
    "retrying",
    "storage_from_env",
    "storage_from_url",
]
