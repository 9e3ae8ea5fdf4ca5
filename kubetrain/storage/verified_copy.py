"""Copy one (possibly many-GiB) file between fsspec locations with bounded memory, verifying its
sha256 on the way and publishing it only once verified.

Used by the checkpoint-collect step for ``model.safetensors`` and its shards, which may be larger
than the memory of the pod that moves them, and whose copy may be interrupted (pod evicted,
node lost) and retried.

How a copy is published depends on the target:

* **Local target**: bytes go to ``<target>.part`` beside it, described by a small sidecar
  ``<target>.part.json`` (expected sha256 and size).  The sha256 is of the part file itself,
  read back (from the page cache) by a thread right behind the writer, so what is verified is
  exactly what is published, and hashing, the slowest stage, overlaps the copy and the fsync.
  A local source is copied by the kernel (``copy_file_range``: no bytes through Python).  Once
  every byte is written and the sha256 matches, the part file (fsynced) is renamed onto the
  target and the folder fsynced.  An interrupted copy leaves the part file and sidecar behind;
  the next call with the same expected sha256 and size hashes the existing prefix and appends
  the rest instead of starting over.
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
import logging
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISDIR, S_ISREG
from typing import IO, Any

from kubetrain import bounded_json
from kubetrain.errors import IntegrityError, InvalidInput, KubetrainError
from kubetrain.storage import atomic
from kubetrain.storage.integrity import sha256_of_chunks
from kubetrain.storage.urls import is_plain_path

log = logging.getLogger(__name__)

#: S3 allows at most 10,000 parts per multipart upload, each but the last at least 5 MiB.
_S3_MAX_PARTS = 9_000
_S3_MIN_PART = 5 * 1024 * 1024
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_NO_SPACE = {errno.ENOSPC, errno.EDQUOT}
#: copy_file_range errors that mean "not between these files": copy through Python instead.
_NO_KERNEL_COPY = {errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM}
#: Read-back buffer of the hashing thread: fits the CPU cache, which hashes faster than 8 MiB.
_HASH_BUFFER = 1024 * 1024


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
    observe: Callable[[int, memoryview], None] | None = None,
) -> CopyResult:
    """Copy ``source`` to ``target`` (paths or fsspec URLs) holding at most about one chunk in
    memory, and publish the target only if its sha256 is ``expected_sha256``.

    Idempotent, so a retried step is cheap: a target that already has the expected sha256 is
    left alone; one with other content is replaced only after the new copy is verified.  Raises
    :class:`IntegrityError` (nothing published, nothing partial left) when the source is missing,
    is no regular file (a FIFO would block the copy, ``/dev/zero`` never end it) or its size or
    sha256 is not the expected one, and :class:`KubetrainError` when the target
    cannot be written (e.g. its disk is full).

    ``observe(offset, bytes)`` sees the bytes of a local target in order as they are hashed
    (from offset 0 again when a copy starts over), so a caller can inspect what is published
    without reading it a second time; it is not called for a target already right, nor for an
    object-store target.
    """
    expected = expected_sha256.strip().lower()
    if not _SHA256_RE.fullmatch(expected):
        raise InvalidInput(
            "expected_sha256", f"{expected_sha256!r} is not a sha256", "give 64 hex digits"
        )
    if chunk_size <= 0:
        raise InvalidInput("chunk_size", f"{chunk_size} is not positive", "give a byte count > 0")
    options = dict(storage_options or {})
    started = time.monotonic()
    if is_plain_path(source) and is_plain_path(target) and not options:
        src_fs = dst_fs = _PlainFiles()
        src_path, dst_path = os.path.abspath(source), os.path.abspath(target)
    else:
        from fsspec.core import url_to_fs

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
        local_source = src_path if _is_local(src_fs) else None
        copied, resumed = _copy_to_local(
            read_source, source, dst_path, expected, size, chunk_size, local_source, observe
        )
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


class _PlainFiles:
    """The two filesystem calls a copy between plain local paths makes, so that it needs no
    fsspec (whose import is most of a `kubetrain collect` process's start-up)."""

    protocol = "file"

    def invalidate_cache(self, path: str | None = None) -> None:
        """Nothing is cached."""

    def info(self, path: str) -> dict[str, Any]:
        """fsspec's answer: "other" for a FIFO or a device, as its LocalFileSystem says."""
        stat = os.stat(path)
        kind = (
            "directory" if S_ISDIR(stat.st_mode) else "file" if S_ISREG(stat.st_mode) else "other"
        )
        return {"type": kind, "size": stat.st_size}


def _is_local(fs: Any) -> bool:
    if isinstance(fs, _PlainFiles):
        return True
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
        raise IntegrityError(
            f"{source} does not exist; nothing was copied: check the path (was it moved?)"
        ) from exc
    if info.get("type") == "directory":
        raise IntegrityError(
            f"{source} is a folder, not a file; nothing was copied: give the path of a file in it"
        )
    if info.get("type") != "file":  # a FIFO would block the copy, /dev/zero never end it
        raise IntegrityError(
            f"{source} is not a regular file (a FIFO, a device...); nothing was copied: copy a file"
        )
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
    return sha256_of_chunks(_read_chunks(fs, path, 0, chunk_size))


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
        recorded = bounded_json.loads(sidecar.read_text())
    except (OSError, ValueError):
        return 0
    if not isinstance(recorded, dict) or recorded.get("sha256") != expected:
        return 0
    if size is None or recorded.get("size") != size:
        return 0
    length = part.stat().st_size
    return length if length <= size else 0


class _PartHasher:
    """sha256 of a part file computed in a thread that reads it back right behind the writer.

    Hashing (~0.6 s a GiB) is the slowest stage of a local copy: run beside the writing and the
    fsync it costs little extra time (hashlib and file reads release the GIL).  Reading the part
    file back hashes exactly the bytes that will be published, whoever wrote them (the kernel's
    copy_file_range or Python), with one small buffer of memory."""

    def __init__(
        self,
        path: Path,
        buffer_size: int,
        observe: Callable[[int, memoryview], None] | None = None,
    ) -> None:
        self.hashed = 0
        self._observe = observe
        self._digest = hashlib.sha256()
        self._ends: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._abandoned = False
        self._error: BaseException | None = None
        self._file = open(path, "rb", buffering=0)  # closed by __exit__
        self._buffer = bytearray(buffer_size)
        self._thread = threading.Thread(target=self._run, name="sha256-part", daemon=True)

    def __enter__(self) -> _PartHasher:
        self._thread.start()
        return self

    def hash_to(self, end: int) -> None:
        """The part file's bytes up to ``end`` are written: hash them."""
        self._ends.put(end)

    def _run(self) -> None:
        view = memoryview(self._buffer)
        try:
            while (end := self._ends.get()) is not None:
                while self.hashed < end and not self._abandoned:
                    read = self._file.readinto(view[: min(len(view), end - self.hashed)])
                    if not read:  # shorter than written: the caller sees hashed != written
                        return
                    self._digest.update(view[:read])
                    if self._observe is not None:
                        self._observe(self.hashed, view[:read])
                    self.hashed += read
        except BaseException as exc:  # re-raised in the caller's thread by hexdigest()
            self._error = exc

    def __exit__(self, exc_type: object, *_: object) -> None:
        self._abandoned = exc_type is not None  # failing anyway: do not hash the rest
        self._ends.put(None)
        self._thread.join()
        self._file.close()

    def hexdigest(self) -> str:
        if self._error is not None:
            raise self._error
        return self._digest.hexdigest()


def _write_from(
    fd: int,
    offset: int,
    read_source: Callable[[int], Iterator[bytes]],
    local_source: str | None,
    chunk_size: int,
) -> Iterator[int]:
    """Write the source from ``offset`` on into ``fd`` at the same offset, yielding the length of
    each piece once it is in the file.  A local source is copied by the kernel (no bytes through
    Python: page cache to page cache); where the kernel cannot (another filesystem, an old
    kernel), or once it reports the end, the source is read and written in chunks."""
    position = offset
    if local_source is not None and hasattr(os, "copy_file_range"):
        with open(local_source, "rb", buffering=0) as src:
            while True:
                try:
                    length = os.copy_file_range(src.fileno(), fd, chunk_size, position, position)
                except OSError as exc:
                    if exc.errno not in _NO_KERNEL_COPY:
                        raise
                    break
                if not length:  # the end, or a filesystem that cannot tell: the loop confirms
                    break
                position += length
                yield length
    for chunk in read_source(position):
        view, done = memoryview(chunk), 0
        while done < len(chunk):  # pwrite: the file position is not used by copy_file_range
            done += os.pwrite(fd, view[done:], position + done)
        position += done
        yield done


def _copy_to_local(
    read_source: Callable[[int], Iterator[bytes]],
    source: str,
    target: str,
    expected: str,
    size: int | None,
    chunk_size: int,
    local_source: str | None = None,
    observe: Callable[[int, memoryview], None] | None = None,
) -> tuple[int, int]:
    """Copy into ``<target>.part`` (resuming it if possible), verify, fsync, rename; return
    (bytes read from the source, resumed offset)."""
    part, sidecar = _part_paths(target)
    offset = _resumable_prefix(target, expected, size)
    copied = 0
    try:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        while True:
            if offset:
                log.info("resuming %s from byte %d of %s", target, offset, part)
                mode = "r+b"
            else:
                part.unlink(missing_ok=True)
                atomic.write_json(sidecar, {"sha256": expected, "size": size, "source": source})
                mode = "wb"
            written = offset
            hash_buffer = min(chunk_size, _HASH_BUFFER)
            with (
                open(part, mode, buffering=0) as out,
                _PartHasher(part, hash_buffer, observe) as hasher,
            ):
                out.truncate(offset)
                hasher.hash_to(offset)  # the reused prefix, while the rest is copied
                for length in _write_from(
                    out.fileno(), offset, read_source, local_source, chunk_size
                ):
                    written += length
                    copied += length
                    hasher.hash_to(written)
                os.fsync(out.fileno())  # while the hasher catches up
            actual = hasher.hexdigest()
            if actual == expected and hasher.hashed == written and size in (None, written):
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
