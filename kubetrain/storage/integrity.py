"""sha256 of a stream of chunks, and of a local file read in chunks (folders and remote files:
kubetrain.storage)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator
from typing import BinaryIO

CHUNK_BYTES = 4 * 1024 * 1024


def sha256_of_chunks(chunks: Iterable[bytes]) -> str:
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk)
    return digest.hexdigest()


def chunks_of(handle: BinaryIO, size: int = CHUNK_BYTES) -> Iterator[bytes]:
    """An open file's remaining bytes, ``size`` at a time, so memory stays bounded."""
    while chunk := handle.read(size):
        yield chunk


def sha256_file(path: str | os.PathLike[str]) -> str:
    with open(path, "rb") as handle:
        return sha256_of_chunks(chunks_of(handle))
