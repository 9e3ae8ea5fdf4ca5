"""Copy one (possibly many-GiB) file between fsspec locations with bounded memory, verifying its
sha256 on the way and publishing it only once verified.

Used by the checkpoint-collect step for ``model.safetensors`` and its shards, which may be larger
than the memory of the pod that moves them, and whose copy may be interrupted (pod evicted,
node lost) and retried.

How a copy is published depends on the target:

* **Local target**: bytes go to ``<target>.part`` beside it, described by a small sidecar
  ``<target>.part.json`` (expected sha256 and size).  Once every byte is written and the
  sha256 matches, the part file is fsynced, renamed onto the target and the folder fsynced.  An
  interrupted copy leaves the part file and sidecar behind; the next call with the same expected
  sha256 and size hashes the existing prefix and appends the rest instead of starting over.
* **S3 target**: written as a multipart upload straight to the final key, opened with
  ``autocommit=False``: S3 shows no object until the upload is completed, which happens only
  after the sha256 matched; otherwise the upload is aborted.  S3 objects cannot be appended to,
  so an interrupted copy to S3 restarts from zero; a killed process can leave an incomplete
  multipart upload (invisible, but billed) for the bucket's ``AbortIncompleteMultipartUpload``
  lifecycle rule to clean up.
* **Other object stores** (gcs, memory, ...): written to ``<target>.part``, then moved onto the
  target once verified; the part is deleted when verification fails.  Also restarted from zero.

Two concurrent copies to the same target are not supported (they would share a part file).
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from kubetrain import atomic
from kubetrain.errors import IntegrityError, InvalidInput, KubetrainError

log = logging.getLogger(__name__)

#: S3 allows at most 10,000 parts per multipart upload, each but the last at least 5 MiB.
_S3_MAX_PARTS = 9_000
_S3_MIN_PART = 5 * 1024 * 1024
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_NO_SPACE = {errno.ENOSPC, errno.EDQUOT}


@dataclass(frozen=True)
class CopyResult:
    """What one call did: ``bytes_copied`` read from the source by this call (0 when the target
    was already right), ``resumed_from`` the length of an earlier part reused, ``sha256`` of the
    published file and the wall-clock ``seconds`` spent."""

    bytes_copied: int
    resumed_from: int
    sha256: str
    seconds: float


def copy_verified(
    source: str,
    target: str,
    *,
    expected_sha256: str,
    expected_size: int | None = None,
    chunk_size: int = 8 * 1024 * 1024,
    storage_options: Mapping[str, Any] | None = None,
) -> CopyResult:
    """Copy ``source`` to ``target`` (paths or fsspec URLs) holding at most about one chunk in
    memory, and publish the target only if its sha256 is ``expected_sha256``.

    Idempotent, so a retried step is cheap: a target that already has the expected sha256 is
    left alone; one with other content is replaced only after the new copy is verified.  Raises
    :class:`IntegrityError` (nothing published, nothing partial left) when the source is missing
    or its size or sha256 is not the expected one, and :class:`KubetrainError` when the target
    cannot be written (e.g. its disk is full).
    """
    from fsspec.core import url_to_fs

    expected = expected_sha256.strip().lower()
    if not _SHA256_RE.match(expected):
        raise InvalidInput(
            "expected_sha256", f"{expected_sha256!r} is not a sha256", "give 64 hex digits"
        )
    if chunk_size <= 0:
        raise InvalidInput("chunk_size", f"{chunk_size} is not positive", "give a byte count > 0")
    options = dict(storage_options or {})
    started = time.monotonic()
    src_fs, src_path = url_to_fs(source, **options)
    dst_fs, dst_path = url_to_fs(target, **options)

    # The target first: a retried step succeeds even if the source was cleaned up since.
    if _target_matches(dst_fs, dst_path, expected, expected_size, chunk_size):
        log.info("%s already has sha256 %s; not copying", target, expected)
        if _is_local(dst_fs):
            _remove_part(dst_path)
        return CopyResult(0, 0, expected, time.monotonic() - started)

    size = _source_size(src_fs, src_path, source)
    if expected_size is not None and size is not None and size != expected_size:
        raise IntegrityError(
            f"{source} is {size} bytes, expected {expected_size} (sha256 {expected}); "
            "it is not the file that was recorded: copy it again from its origin"
        )
    if size is None:
        size = expected_size

    def read_source(offset: int) -> Iterator[bytes]:
        return _read_chunks(src_fs, src_path, offset, chunk_size)

    if _is_local(dst_fs):
        copied, resumed = _copy_to_local(read_source, source, dst_path, expected, size, chunk_size)
    else:
        copied, resumed = _copy_to_object_store(
            read_source, source, dst_fs, dst_path, expected, size, chunk_size
        )
    seconds = time.monotonic() - started
    log.info(
        "copied %s to %s (%d bytes, %.1fs, sha256 %s)", source, target, copied, seconds, expected
    )
    return CopyResult(copied, resumed, expected, seconds)


# -- reading -------------------------------------------------------------------------------------


def _is_local(fs: Any) -> bool:
    from fsspec.implementations.local import LocalFileSystem

    return isinstance(fs, LocalFileSystem)


def _is_s3(fs: Any) -> bool:
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    return "s3" in protocols


def _source_size(fs: Any, path: str, source: str) -> int | None:
    fs.invalidate_cache(path)  # another process (the trainer) may have just written it
    try:
        info = fs.info(path)
    except FileNotFoundError as exc:
        raise IntegrityError(f"{source} does not exist; nothing was copied") from exc
    if info.get("type") == "directory":
        raise IntegrityError(f"{source} is a folder, not a file; nothing was copied")
    return info.get("size")


def _open_read(fs: Any, path: str, chunk_size: int) -> IO[bytes]:
    if _is_local(fs):
        return open(path, "rb", buffering=0)
    if _is_s3(fs):
        # One ranged GET per read, no read-ahead cache holding another block.
        return fs.open(path, "rb", block_size=chunk_size, cache_type="none")
    return fs.open(path, "rb")


def _read_chunks(fs: Any, path: str, offset: int, chunk_size: int) -> Iterator[bytes]:
    """The file from ``offset`` on, ``chunk_size`` bytes at a time."""
    with _open_read(fs, path, chunk_size) as handle:
        if offset:
            handle.seek(offset)
        while chunk := handle.read(chunk_size):
            yield chunk


def _hash_file(fs: Any, path: str, chunk_size: int) -> str:
    digest = hashlib.sha256()
    for chunk in _read_chunks(fs, path, 0, chunk_size):
        digest.update(chunk)
    return digest.hexdigest()


def _target_matches(fs: Any, path: str, expected: str, size: int | None, chunk_size: int) -> bool:
    """Whether the target already holds the expected bytes (sizes compared before hashing)."""
    fs.invalidate_cache(path)
    try:
        info = fs.info(path)
    except FileNotFoundError:
        return False
    if info.get("type") == "directory":
        raise KubetrainError(f"cannot copy to {path}: it is a folder; give a file path")
    if size is not None and info.get("size") not in (None, size):
        return False
    return _hash_file(fs, path, chunk_size) == expected


def _mismatch(source: str, expected: str, actual: str, size: int | None, copied: int) -> str:
    sizes = f" ({copied} bytes read, {size} expected)" if size not in (None, copied) else ""
    return (
        f"{source} has sha256 {actual}, expected {expected}{sizes}; it is corrupt or not the "
        "file that was recorded, so nothing was published: copy it again from its origin"
    )


# -- local targets -------------------------------------------------------------------------------


def _part_paths(target: str) -> tuple[Path, Path]:
    return Path(f"{target}.part"), Path(f"{target}.part.json")


def _remove_part(target: str) -> None:
    part, sidecar = _part_paths(target)
    part.unlink(missing_ok=True)
    sidecar.unlink(missing_ok=True)


def _resumable_prefix(target: str, expected: str, size: int | None) -> int:
    """Length of a part file an interrupted copy of the same bytes left behind, or 0.

    The sidecar identifies the content by expected sha256 and size, not by source URL: a
    different source with the same sha256 holds the same bytes, so its prefix is reusable."""
    part, sidecar = _part_paths(target)
    if not part.is_file():
        return 0
    try:
        recorded = json.loads(sidecar.read_text())
    except (OSError, ValueError):
        return 0
    if not isinstance(recorded, dict) or recorded.get("sha256") != expected:
        return 0
    if size is None or recorded.get("size") != size:
        return 0
    length = part.stat().st_size
    return length if length <= size else 0


def _copy_to_local(
    read_source: Callable[[int], Iterator[bytes]],
    source: str,
    target: str,
    expected: str,
    size: int | None,
    chunk_size: int,
) -> tuple[int, int]:
    """Copy into ``<target>.part`` (resuming it if possible), verify, fsync, rename; return
    (bytes read from the source, resumed offset)."""
    part, sidecar = _part_paths(target)
    offset = _resumable_prefix(target, expected, size)
    copied = 0
    try:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        while True:
            digest = hashlib.sha256()
            if offset:
                log.info("resuming %s from byte %d of %s", target, offset, part)
                with open(part, "rb", buffering=0) as handle:
                    remaining = offset
                    while remaining:
                        chunk = handle.read(min(chunk_size, remaining))
                        if not chunk:  # shrank under us; start over
                            break
                        digest.update(chunk)
                        remaining -= len(chunk)
                if remaining:
                    offset = 0
                    continue
                mode = "r+b"
            else:
                part.unlink(missing_ok=True)
                atomic.write_json(sidecar, {"sha256": expected, "size": size, "source": source})
                mode = "wb"
            written = offset
            with open(part, mode) as out:
                out.seek(offset)
                out.truncate()
                for chunk in read_source(offset):
                    digest.update(chunk)
                    out.write(chunk)
                    written += len(chunk)
                    copied += len(chunk)
                out.flush()
                os.fsync(out.fileno())
            actual = digest.hexdigest()
            if actual == expected and size in (None, written):
                break
            if offset:
                # The reused prefix may be what is wrong (e.g. torn by a power loss): once more
                # from zero before blaming the source.
                log.warning("resumed copy of %s did not verify; copying again from zero", target)
                offset = 0
                continue
            _remove_part(target)
            raise IntegrityError(_mismatch(source, expected, actual, size, written))
        os.replace(part, target)
        atomic.fsync_dir(Path(target).parent)
        sidecar.unlink(missing_ok=True)
    except OSError as exc:
        if exc.errno in _NO_SPACE:
            _remove_part(target)
            raise KubetrainError(
                f"no space left on the device holding {target} after {copied} bytes of "
                f"{source}; nothing was published there and the partial {part} was removed: "
                "free space or choose another target, then retry"
            ) from exc
        raise  # anything else (a dropped connection...) keeps the part for the retry to resume
    return copied, offset


# -- object-store targets ------------------------------------------------------------------------


def _copy_to_object_store(
    read_source: Callable[[int], Iterator[bytes]],
    source: str,
    fs: Any,
    path: str,
    expected: str,
    size: int | None,
    chunk_size: int,
) -> tuple[int, int]:
    """Upload from zero (objects cannot be appended to) and make the key appear only once the
    sha256 matched; return (bytes read from the source, 0)."""
    s3 = _is_s3(fs)
    if s3:
        # Multipart upload straight to the key: nothing is visible until commit().
        block = max(chunk_size, _S3_MIN_PART, -(-(size or 0) // _S3_MAX_PARTS))
        out = fs.open(path, "wb", block_size=block, autocommit=False)
        staged = path
    else:
        staged = f"{path}.part"
        fs.makedirs(fs._parent(path), exist_ok=True)
        out = fs.open(staged, "wb")
    digest = hashlib.sha256()
    written = 0
    try:
        for chunk in read_source(0):
            digest.update(chunk)
            out.write(chunk)
            written += len(chunk)
        out.close()  # S3: the last part is uploaded, the upload not yet completed
    except BaseException:
        _discard(fs, out, staged, s3)
        raise
    actual = digest.hexdigest()
    if actual != expected or size not in (None, written):
        _discard(fs, out, staged, s3)
        raise IntegrityError(_mismatch(source, expected, actual, size, written))
    try:
        if s3:
            out.commit()
        else:
            fs.mv(staged, path)
    except BaseException:
        _discard(fs, out, staged, s3)
        raise
    fs.invalidate_cache(path)
    return written, 0


def _discard(fs: Any, out: Any, staged: str, s3: bool) -> None:
    """Leave nothing behind: abort the multipart upload, or delete the staged part object."""
    try:
        if s3:
            out.discard()  # aborts the multipart upload; nothing appears at the key
            out.closed = True  # else close() (or __del__) would try to upload the rest
        else:
            if not out.closed:
                out.close()
            if fs.exists(staged):
                fs.rm(staged)
    except Exception:  # the original error matters more
        log.warning("could not clean up the partial upload %s", staged, exc_info=True)
