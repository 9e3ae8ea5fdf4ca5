"""A real S3-compatible HTTP server for tests: moto in server mode (as s3fs's own test suite
uses it), on a free local port, with credentials and endpoint handed over through the usual
environment variables so code under test configures itself as it would against real S3."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

#: Dummy credentials moto accepts; never real ones.
ACCESS_KEY_ID = "kubetrain-test-key"
SECRET_ACCESS_KEY = "kubetrain-test-secret"
REGION = "us-east-1"


@dataclass(frozen=True)
class S3Server:
    endpoint_url: str

    def env(self) -> dict[str, str]:
        """The environment an S3 client (boto3, s3fs) reads its endpoint and keys from."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ENDPOINT_URL_S3": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
            "AWS_DEFAULT_REGION": REGION,
        }

    def create_bucket(self, name: str) -> None:
        import boto3

        boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=ACCESS_KEY_ID,
            aws_secret_access_key=SECRET_ACCESS_KEY,
            region_name=REGION,
        ).create_bucket(Bucket=name)

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        """Every key under ``prefix``, to check what was (and was not) written."""
        import boto3

        client = boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=ACCESS_KEY_ID,
            aws_secret_access_key=SECRET_ACCESS_KEY,
            region_name=REGION,
        )
        keys: list[str] = []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            keys += [item["Key"] for item in page.get("Contents", [])]
        return keys


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def s3_server() -> Iterator[S3Server]:
    """Start moto's S3 server on 127.0.0.1 and stop it afterwards.

    fsspec caches one filesystem per set of options, and s3fs takes its endpoint from the
    environment, not the options: a filesystem cached while an earlier server ran would keep
    talking to that server's (closed) port. The cache is cleared on both sides of a server."""
    from moto.server import ThreadedMotoServer
    from s3fs import S3FileSystem

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    S3FileSystem.clear_instance_cache()
    try:
        yield S3Server(f"http://127.0.0.1:{port}")
    finally:
        server.stop()
        S3FileSystem.clear_instance_cache()
