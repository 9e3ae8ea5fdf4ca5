"""sha256 of a local file, read in chunks (folders and remote files: kubetrain.storage)."""

from __future__ import annotations

import hashlib
import os

CHUNK_BYTES = 4 * 1024 * 1024


def sha256_file(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()
