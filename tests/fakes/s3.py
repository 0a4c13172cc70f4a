"""moto's S3 server over real HTTP on 127.0.0.1, for storage, S3-run and deployment tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tasks.core import storage

SECRET = "moto-SECRET-key-0f3a"  # must never reach an artifact


@contextmanager
def moto_s3(bucket: str) -> Iterator[dict[str, str]]:
    """moto's S3 server on 127.0.0.1 with ``bucket`` created; the ``AWS_*`` variables point
    boto3 at it while the block runs (yielded, for subprocesses)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "querylab-test",
           "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": "us-east-1"}
    mp = pytest.MonkeyPatch()
    for k, v in env.items():
        mp.setenv(k, v)
    storage.reset_s3_client()
    try:
        storage._s3().create_bucket(Bucket=bucket)
        yield env
    finally:
        storage.reset_s3_client()
        mp.undo()
        server.stop()
