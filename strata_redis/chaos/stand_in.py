"""The S3 stand-in of a fault run: moto's S3 server on loopback, the workers' link to it
through a ``Proxy`` (to cut or stall checkpoint uploads), a bucket made for the run."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

from ..server import free_port
from ..storage.s3 import S3Storage
from .proxy import Proxy

__all__ = ["MotoServer", "S3StandIn", "available"]

BUCKET = "chaos"
PREFIX = "ckpt"
#: the dummy credentials and region moto takes (never a real account's)
ENV = {
    "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1",
}  # fmt: skip


def available() -> bool:
    """Whether moto's server and boto3 are installed (the dev set-up has both)."""
    return all(importlib.util.find_spec(m) is not None for m in ("moto", "boto3", "flask"))


class MotoServer:
    """``moto.server`` on 127.0.0.1:<free port> in its own process group: a real S3 endpoint
    over HTTP (``endpoint_url`` is what boto3 talks to). ``launch`` spawns it (it takes
    seconds to import: start it early), ``wait`` waits until it answers; ``start`` does both.
    The process tier's S3 tests use it too (``tests/s3server.py``)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def launch(self) -> MotoServer:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        return self

    def wait(self, timeout: float = 30.0) -> MotoServer:
        """Wait until the server answers.

        Raises:
            RuntimeError: it exited, or did not answer within ``timeout`` (then stopped).
        """
        assert self.proc is not None, "launch() first"
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(f"{self.endpoint_url}/moto-api/", timeout=1).close()
                return self
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError("moto server exited at start") from None
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("moto server did not start") from None
                time.sleep(0.1)

    def start(self, timeout: float = 30.0) -> MotoServer:
        return self.launch().wait(timeout)

    def reset(self) -> None:
        """Forget every bucket and object."""
        req = urllib.request.Request(f"{self.endpoint_url}/moto-api/reset", method="POST")
        urllib.request.urlopen(req, timeout=5).close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.proc = None


class S3StandIn:
    """``moto.server`` on 127.0.0.1 with the bucket ``BUCKET``; ``proxy`` in front of it is
    the workers' endpoint (``env``), the run's own checks talk to it directly (``storage``).
    The server starts in the background (it takes seconds to import); ``start`` waits for
    it.
    """

    def __init__(self) -> None:
        self.moto = MotoServer().launch()
        self.proxy: Proxy | None = None

    def start(self, timeout: float = 30.0) -> S3StandIn:
        """Wait until the server answers; put the proxy in front; make the bucket.

        Raises:
            RuntimeError: moto did not start within ``timeout``.
        """
        self.moto.wait(timeout)
        self.proxy = Proxy(("127.0.0.1", self.moto.port))
        with self.credentials():
            import boto3

            boto3.client("s3", endpoint_url=self.moto.endpoint_url).create_bucket(Bucket=BUCKET)
        return self

    @property
    def url(self) -> str:
        """The checkpoints' storage URL, as a worker's ``checkpoint_path``."""
        return f"s3://{BUCKET}/{PREFIX}"

    @property
    def env(self) -> dict[str, str]:
        """What a worker's environment needs: the proxy as its endpoint, the credentials."""
        assert self.proxy is not None, "start() first"
        return {**ENV, "AWS_ENDPOINT_URL": f"http://{self.proxy.address}"}

    @contextlib.contextmanager
    def credentials(self) -> Iterator[None]:
        """This process's AWS variables set to the stand-in's dummy ones for a while (the
        storage takes credentials from the environment only)."""
        saved = {k: os.environ.get(k) for k in ENV}
        os.environ.update(ENV)
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def storage(self) -> S3Storage:
        """The checkpoints' storage, straight to moto (call inside ``credentials``)."""
        return S3Storage(BUCKET, "us-east-1", self.moto.endpoint_url, prefix=PREFIX)

    def close(self) -> None:
        if self.proxy is not None:
            self.proxy.close()
        self.moto.stop()

    def __enter__(self) -> S3StandIn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
