"""A real S3-protocol server on loopback for tests: moto's server mode, in a thread.

Use from any test module (or conftest)::

    from tests.s3server import s3_server, s3_store  # noqa: F401  (registers the fixtures)

    def test_something(s3_store, alice):
        ...  # settings.SYNTH_OBJECT_STORE now points at a fresh prefix of the moto bucket

``s3_server`` (session) starts the server once and creates the bucket; ``s3_store``
(function) points the settings at a fresh ``s3://bucket/<random prefix>`` so content-addressed
keys never leak between tests, and sets the AWS variables the backend reads.

What moto 5.2 does and does not enforce (checked against it, see tests/objects/test_s3.py):

* ``If-None-Match: *`` on PutObject is honoured (412 PreconditionFailed), direct or presigned,
  when the header is sent.
* Presigned URL signatures are not checked, so a client that leaves out signed headers
  (If-None-Match, x-amz-checksum-sha256, Content-Length) is not refused as AWS S3 would.
* ``x-amz-checksum-sha256`` is NOT validated against the body: moto stores the client's claim
  (when ``x-amz-sdk-checksum-algorithm`` is sent) and returns it from HeadObject. Hence
  ``SYNTH_S3_VERIFY=download`` here: the store re-hashes bytes itself before any commit.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

ACCESS_KEY = "synth-test"
SECRET_KEY = "synth-test-secret"
REGION = "us-east-1"


@dataclass(frozen=True)
class S3Server:
    endpoint_url: str
    bucket: str
    region: str = REGION
    access_key: str = ACCESS_KEY
    secret_key: str = SECRET_KEY

    def client(self) -> Any:
        """A plain boto3 client on the server, for tests that inspect or tamper with the bucket."""
        import boto3
        from botocore.config import Config

        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=self.region,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            config=Config(signature_version="s3v4", s3={"addressing_style": "path"}),
        )


@dataclass(frozen=True)
class S3Store:
    server: S3Server
    prefix: str

    def key(self, sha256: str) -> str:
        return f"{self.prefix}/sha256/{sha256}"


def s3_server_start(bucket: str = "synth-test") -> tuple[Any, S3Server]:
    """Start moto's server on a free loopback port; returns (server to .stop(), S3Server)."""
    from moto.server import ThreadedMotoServer

    # One line per request on stderr otherwise.
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    info = S3Server(endpoint_url=f"http://{host}:{port}", bucket=bucket)
    info.client().create_bucket(Bucket=bucket)
    return server, info


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    server, info = s3_server_start()
    try:
        yield info
    finally:
        server.stop()


@pytest.fixture
def s3_store(s3_server: S3Server, settings: Any, monkeypatch: pytest.MonkeyPatch) -> S3Store:
    prefix = f"t-{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    # moto stores checksum claims without validating them; see the module docstring.
    settings.SYNTH_S3_VERIFY = "download"
    settings.SYNTH_OBJECT_STORE = f"s3://{s3_server.bucket}/{prefix}"
    settings.SYNTH_S3_ENDPOINT_URL = s3_server.endpoint_url
    settings.SYNTH_S3_REGION = s3_server.region
    return S3Store(server=s3_server, prefix=prefix)
