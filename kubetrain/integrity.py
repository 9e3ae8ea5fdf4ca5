"""sha256 digests of files and folders, and their verification."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from kubetrain.errors import IntegrityError

CHUNK_BYTES = 4 * 1024 * 1024


def sha256_file(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def folder_digests(root: str | os.PathLike[str], exclude: tuple[str, ...] = ()) -> dict[str, str]:
    """Digest of every file under ``root``, keyed by its POSIX path relative to ``root``."""
    base = Path(root)
    digests = {}
    for path in sorted(p for p in base.rglob("*") if p.is_file()):
        relative = path.relative_to(base).as_posix()
        if relative not in exclude:
            digests[relative] = sha256_file(path)
    return digests


def verify_digests(root: str | os.PathLike[str], expected: dict[str, str], what: str) -> None:
    """Raise naming the first file under ``root`` that is missing or differs from its digest."""
    base = Path(root)
    for relative, digest in sorted(expected.items()):
        path = base / relative
        if not path.is_file():
            raise IntegrityError(f"{what}: file {path} listed in its manifest is missing")
        actual = sha256_file(path)
        if actual != digest:
            raise IntegrityError(
                f"{what}: file {path} is corrupt (sha256 {actual[:12]}…, manifest says "
                f"{digest[:12]}…); re-create it rather than use it"
            )
