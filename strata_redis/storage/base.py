"""The storage interface every backend implements, and the path and buffer rules they share."""

from __future__ import annotations

import abc
import re
from collections.abc import Callable, Collection, Sequence
from types import TracebackType
from typing import TypeVar

__all__ = [
    "MAX_PATH_BYTES",
    "TMP_PREFIX",
    "InUse",
    "Storage",
    "as_byte_view",
    "check_path",
    "check_prefix",
    "check_range",
]

# S3 keys are at most 1024 bytes of UTF-8 and most filesystems cap a name at 255 bytes; both
# limits apply on every backend, so a path valid on one is valid on the other.
MAX_PATH_BYTES = 1024
MAX_NAME_BYTES = 255

# Temporary files of in-flight local writes start with this; no object name may.
TMP_PREFIX = ".strata-tmp-"

_S = TypeVar("_S", bound="Storage")
_CONTROL = re.compile("[\x00-\x1f\x7f]")  # (control characters, NUL included)

#: ``remove_abandoned``'s ``in_use``: given the paths of the debris found, the paths among
#: them a writer may still be writing (left alone)
InUse = Callable[[list[str]], Collection[str]]


def check_path(path: object, *, arg: str = "path") -> str:
    """Return ``path`` if it is a valid object path, else raise naming it.

    A valid path is relative and ``/``-separated: no leading ``/``, no empty, ``.`` or ``..``
    component, no backslash, no control character (NUL included), no surrogate, no component
    starting with the reserved temporary-file prefix, at most 1024 UTF-8 bytes with names of
    at most 255. Any other Unicode text is fine.

    Raises:
        TypeError: ``path`` is not a ``str``.
        ValueError: ``path`` breaks one of the rules above.
    """
    if not isinstance(path, str):
        raise TypeError(f"{arg} must be a str, got {type(path).__name__} {path!r}")
    problem = _path_problem(path)
    if problem is not None:
        raise ValueError(f"{arg} {path!r} is not a valid storage path: {problem}")
    return path


def _path_problem(path: str) -> str | None:
    if not path:
        return "it is empty"
    if path.startswith("/"):
        return "absolute paths are refused (it must be relative to the storage root)"
    if "\\" in path:
        return "backslashes are refused (use '/' to separate names)"
    if _CONTROL.search(path):
        return "control characters (NUL included) are refused"
    try:
        size = len(path.encode("utf-8"))
    except UnicodeEncodeError:
        return "it is not valid Unicode text (lone surrogate)"
    if size > MAX_PATH_BYTES:
        return f"it is {size} bytes of UTF-8, more than {MAX_PATH_BYTES}"
    for name in path.split("/"):
        if name in ("", ".", ".."):
            return f"empty, '.' and '..' names are refused (found {name!r})"
        if name.startswith(TMP_PREFIX):
            return f"names starting with {TMP_PREFIX!r} are reserved for temporary files"
        if len(name.encode("utf-8")) > MAX_NAME_BYTES:
            return f"the name {name[:32]!r}... is longer than {MAX_NAME_BYTES} bytes"
    return None


def check_prefix(prefix: object, *, arg: str = "prefix") -> str:
    """Return ``prefix`` if it is ``""`` or a valid path, optionally ending with ``/``.

    Raises:
        TypeError: ``prefix`` is not a ``str``.
        ValueError: ``prefix`` is not a valid path prefix (see :func:`check_path`).
    """
    if not isinstance(prefix, str):
        raise TypeError(f"{arg} must be a str, got {type(prefix).__name__} {prefix!r}")
    if prefix:
        check_path(prefix[:-1] if prefix.endswith("/") else prefix, arg=arg)
    return prefix


def check_range(start: object, length: object) -> None:
    """Check a ``read_range``'s byte range: two non-negative ints (``bool`` is not one).

    Raises:
        TypeError, ValueError: naming the bad argument.
    """
    for arg, value in (("start", start), ("length", length)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{arg} must be an int, got {type(value).__name__} {value!r}")
        if value < 0:
            raise ValueError(f"{arg} must be >= 0, got {value}")


def as_byte_view(data: object, *, arg: str = "data") -> memoryview:
    """Return a flat, read-only byte view of ``data`` without copying it.

    Accepts any C-contiguous object with the buffer protocol: ``bytes``, ``bytearray``,
    ``memoryview``, ``array.array``, numpy arrays of any plain-data dtype and shape, ``mmap``.

    Raises:
        TypeError: ``data`` does not support the buffer protocol (``str``, ``list``, ...), or
            its items are not plain data: Python object references (a numpy ``object``
            dtype, or a structured dtype with such a field) or pointers, whose bytes are
            memory addresses, meaningless once saved.
        ValueError: ``data`` is a buffer but not C-contiguous.
    """
    if isinstance(data, str):
        raise TypeError(f"{arg} must be a bytes-like object, got str (encode it first)")
    try:
        view = memoryview(data)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"{arg} must be a bytes-like object (bytes, bytearray, memoryview or a numpy "
            f"array), got {type(data).__name__}"
        ) from None
    if _holds_references(data, view.format):
        raise TypeError(
            f"{arg} must hold plain data, got a {type(data).__name__} of "
            f"{_item_kind(data, view.format)}: its bytes are memory addresses of Python "
            "objects, not their values (convert it to a numeric/bytes dtype, or serialize "
            "the objects first)"
        )
    if not view.c_contiguous:
        raise ValueError(
            f"{arg} must be C-contiguous, got a non-contiguous {type(data).__name__} "
            "(numpy: np.ascontiguousarray)"
        )
    if view.nbytes == 0:
        return memoryview(b"")
    if view.format == "B" and view.ndim == 1:
        return view.toreadonly()
    try:
        return view.cast("B").toreadonly()
    except (TypeError, ValueError):
        # memoryview.cast only takes native single-character formats; big-endian, complex
        # and structured numpy dtypes need a format-blind view of the same memory.
        import numpy as np

        return np.frombuffer(view, dtype=np.uint8).data.toreadonly()


# struct/PEP 3118 codes of items that are addresses: 'O' a Python object, 'P' a pointer
# (field names of structured formats, between colons, are cut first)
_FIELD_NAME = re.compile(r":[^:]*:")


def _holds_references(data: object, fmt: str) -> bool:
    dtype = getattr(data, "dtype", None)
    if getattr(dtype, "hasobject", False):
        return True
    return any(code in _FIELD_NAME.sub("", fmt) for code in "OP")


def _item_kind(data: object, fmt: str) -> str:
    dtype = getattr(data, "dtype", None)
    return f"dtype {dtype}" if dtype is not None else f"item format {fmt!r}"


class Storage(abc.ABC):
    """Bytes under ``/``-separated relative paths: the interface every backend implements.

    Paths follow :func:`check_path` on every backend. Data is any C-contiguous buffer
    (:func:`as_byte_view`); it is written without an extra copy, and must not change while a
    write runs. Failures raise :class:`~strata_redis.errors.StorageError` (its subclass
    ``StorageNotFoundError`` for a missing object); bad arguments raise ``TypeError`` or
    ``ValueError`` naming them. Storages are safe to share between threads.
    """

    @abc.abstractmethod
    def write(self, path: str, data: object) -> None:
        """Store ``data`` at ``path``, replacing any previous object, all or nothing.

        Args:
            path: the object path.
            data: the bytes, as any C-contiguous buffer.

        Raises:
            StorageError: the backend failed; the previous object (if any) is untouched.
        """

    def write_chunks(self, path: str, chunks: Sequence[memoryview]) -> None:
        """Store the chunks, one after the other, as one object at ``path`` (as ``write``).

        For a part made of pieces (a serialized state whose tensor bytes stay where they
        were staged). This default joins them into one buffer first (a copy); a backend that
        can write pieces in turn (``LocalStorage``) overrides it.

        Raises:
            StorageError: the backend failed; the previous object (if any) is untouched.
        """
        self.write(path, b"".join(chunks))

    @abc.abstractmethod
    def write_if_absent(self, path: str, data: object) -> None:
        """Store ``data`` at ``path`` only if no object is there yet, atomically.

        Raises:
            StorageExistsError: an object already exists at ``path``; it is untouched.
            StorageError: the backend failed.
        """

    @abc.abstractmethod
    def read(self, path: str) -> bytes:
        """Return the whole object at ``path``.

        Raises:
            StorageNotFoundError: no object at ``path``.
            StorageError: the backend failed.
        """

    def read_range(self, path: str, start: int, length: int) -> bytes:
        """Return ``length`` bytes of the object at ``path`` from byte ``start`` (fewer only
        where the object ends first; none from its end on).

        For reading part of a large object (one sample of a shard, the headers of a tar).
        This default reads the whole object and slices it; the backends override it with a
        read of the range alone (a ``pread``, an HTTP ``Range`` GET).

        Raises:
            ValueError: ``start`` or ``length`` is negative.
            StorageNotFoundError: no object at ``path``.
            StorageError: the backend failed.
        """
        check_range(start, length)
        return self.read(path)[start : start + length]

    #: each request costs this process client CPU worth moving out of it (S3: boto3's few
    #: ms a request): a reader copying many objects may do it in helper processes, each with
    #: a copy of the storage (it pickles). False here.
    remote: bool = False

    def local_file(self, path: str) -> str | None:
        """The file holding the object at ``path`` on this machine, when the backend keeps
        its objects as local files (``LocalStorage``); None otherwise (this default).

        For a reader that can use the object in place instead of copying it (a shard read by
        loader processes): the file is the backend's own, to be read, never written or
        deleted. Whether it exists is not checked (a read says so).

        Raises:
            TypeError, ValueError: a bad path.
        """
        check_path(path)
        return None

    @abc.abstractmethod
    def exists(self, path: str) -> bool:
        """Return whether an object exists at ``path``.

        Raises:
            StorageError: the backend failed.
        """

    @abc.abstractmethod
    def delete(self, path: str) -> None:
        """Delete the object at ``path``; deleting a missing object does nothing.

        Raises:
            StorageError: the backend failed.
        """

    @abc.abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Return the sorted paths of every object whose path starts with ``prefix``.

        The prefix is a plain string prefix, as on S3: ``"step_1"`` matches
        ``"step_1/model.bin"`` and ``"step_10/model.bin"``; ``"step_1/"`` only the former.

        Raises:
            StorageError: the backend failed.
        """

    @abc.abstractmethod
    def describe(self) -> str:
        """Return a short URL-like description such as ``s3://bucket/prefix`` (no secrets)."""

    def remove_abandoned(
        self, prefix: str, older_than: float | None = None, *, in_use: InUse | None = None
    ) -> int:
        """Delete what killed writers left under ``prefix``; return how many things it deleted.

        Only a backend's own debris (a local writer's hidden temporary files, an S3
        multipart upload) is touched, never an object; a backend that leaves none deletes
        nothing.

        Args:
            prefix: a directory-like prefix ending in ``/``.
            older_than: only debris older than this many seconds, by the store's own clock
                where it has one (S3: its response's ``Date``); None for all of it (the
                caller knows nothing can still be writing there).
            in_use: called once with the paths of the debris found (an upload's object
                path; a temporary file's path, in the directory its object goes to); the
                paths it returns are left alone, however old: the caller knows a writer may
                still be writing there (a checkpoint in flight).

        Raises:
            StorageError: the backend failed.
        """
        check_prefix(prefix)
        return 0

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op unless a backend holds resources
        """Release network connections and other resources; the storage is unusable after."""

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
