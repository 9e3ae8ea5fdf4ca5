"""Folders on local disk or in object storage, named by a path or any fsspec URL.

A location is a local path, a ``file://`` URL (both handled as today: staging folder, fsync,
rename) or another fsspec URL such as ``s3://bucket/prefix`` (s3fs reads its endpoint and keys
from AWS_ENDPOINT_URL(_S3), AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION).

Object stores have no atomic folder rename, so a folder is published there by writing every
file under its final key and **the manifest last**: a reader trusts a folder only when its
manifest exists and every file matches the manifest's sha256, so a half-written folder (files,
no manifest) is never taken for a complete one. Each object itself appears whole or not at all.

Local locations are handled with the standard library and fsspec is imported only for URLs:
importing it costs about 0.09 s, paid by every step's process on every run.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from kubetrain.errors import IntegrityError, InvalidInput
from kubetrain.storage import atomic
from kubetrain.storage.integrity import chunks_of, sha256_file, sha256_of_chunks
from kubetrain.storage.urls import file_url_path, protocol_of
from kubetrain.storage.verified_copy import copy_verified

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

Location = str | os.PathLike[str]
#: A file in a local folder (e.g. a KFP artifact) saying that the content lives at this URL.
POINTER = "LOCATION"
_LOCAL_PROTOCOLS = ("file", "local")


def is_local(location: Location) -> bool:
    """A plain path or a ``file://`` URL: published with staging+fsync+rename."""
    return isinstance(location, os.PathLike) or protocol_of(str(location)) in _LOCAL_PROTOCOLS


def local_path(location: Location, field: str = "path") -> Path:
    """The local path of a local location (``file:///x`` gives ``/x``)."""
    text = os.fspath(location)
    return file_url_path(text, field) if text.startswith("file:") else Path(text)


def resolve(location: Location, field: str = "path") -> tuple[AbstractFileSystem, str]:
    """The fsspec filesystem of ``location`` and the path within it; ``field`` names the option
    in the error when the protocol is unknown or its package is not installed."""
    from fsspec.core import url_to_fs

    text = os.fspath(location)
    try:
        return url_to_fs(text)
    except ImportError as exc:
        protocol = protocol_of(text)
        extra = "pip install 'kubetrain[s3]'" if protocol in ("s3", "s3a") else str(exc)
        raise InvalidInput(
            field, f"{text!r} needs the {protocol}:// filesystem, which is not installed", extra
        ) from exc
    except ValueError as exc:
        raise InvalidInput(
            field,
            f"{text!r} uses an unknown protocol ({exc})",
            "give a local path, file:///path, s3://bucket/prefix or another fsspec URL",
        ) from exc


#: Object stores whose URL's first segment is the bucket: ``s3:///models`` names none.
_BUCKET_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss"})
#: fsspec filesystems that read only (their writes raise NotImplementedError).
_READ_ONLY_PROTOCOLS = frozenset(
    {"http", "https", "github", "git", "zip", "tar", "libarchive", "reference"}
)


def check_location(location: Location, field: str = "path") -> None:
    """Refuse an unusable location before any work: a bad file URL, a URL that names no place
    (``s3://``, ``s3:///x``, ``memory://``), an unknown protocol or a filesystem whose package
    is not installed (a local path needs no fsspec)."""
    if is_local(location):
        local_path(location, field)
        return
    text = os.fspath(location)
    protocol, separator, rest = text.partition("://")
    if separator and (
        not rest.strip("/") or (protocol.lower() in _BUCKET_PROTOCOLS and rest.startswith("/"))
    ):
        raise InvalidInput(
            field,
            f"{text!r} names no {'bucket' if protocol.lower() in _BUCKET_PROTOCOLS else 'path'}",
            f"give the place, e.g. {protocol}://bucket/prefix",
        )
    resolve(location, field)


def check_writable(location: Location, field: str = "path") -> None:
    """Refuse a location on a filesystem fsspec can only read (``http://``, ``zip://``...),
    before anything is read or written there; then :func:`check_location`."""
    protocol = protocol_of(os.fspath(location))
    if protocol in _READ_ONLY_PROTOCOLS:
        raise InvalidInput(
            field,
            f"{os.fspath(location)!r}: {protocol}:// can be read but not written",
            "give a folder or a writable URL, e.g. s3://bucket/models",
        )
    check_location(location, field)


def check_protocol(location: Location, field: str = "path") -> None:
    """Refuse a URL whose protocol fsspec does not know, without opening it: for locations only
    a job's nodes use, whose filesystem package need not be installed where the job is made."""
    from fsspec.registry import available_protocols

    text = os.fspath(location)
    protocol = protocol_of(text)
    if protocol not in _LOCAL_PROTOCOLS and protocol not in available_protocols():
        raise InvalidInput(
            field,
            f"{text!r} uses an unknown protocol {protocol!r}",
            "give a local path, file:///path, s3://bucket/prefix or another fsspec URL",
        )


def join(location: Location, *parts: str) -> Path | str:
    """``location/part/...``: a Path for local locations, a URL string otherwise."""
    if is_local(location):
        return local_path(location).joinpath(*parts)
    return "/".join([os.fspath(location).rstrip("/"), *parts])


def name_of(location: Location) -> str:
    """The last component of a location's path."""
    return os.fspath(location).rstrip("/").rsplit("/", 1)[-1]


def _fresh(location: Location, field: str = "path") -> tuple[AbstractFileSystem, str]:
    """Resolve without s3fs's listing cache: other processes write the same prefixes."""
    fs, path = resolve(location, field)
    fs.invalidate_cache()
    return fs, path


def run_folder(storage_url: str, kind: str, run_name: str) -> str:
    """``storage_url/kind/run_name``: where a pipeline run keeps its datasets, checkpoints
    or models in object storage."""
    resolve(storage_url, "storage")
    if not run_name:
        raise InvalidInput("run_name", "is empty", "pass the pipeline run's name with storage")
    return str(join(storage_url, kind, run_name))


def write_pointer(folder: Location, target: Location) -> None:
    """Make local ``folder`` stand for ``target``: a KFP artifact whose data is elsewhere."""
    write_text(join(folder, POINTER), os.fspath(target) + "\n")


def dereference(location: Location) -> Location:
    """The URL a pointer folder names (see :func:`write_pointer`), else ``location`` itself."""
    if not is_local(location):
        return location
    pointer = local_path(location) / POINTER
    if not pointer.is_file():
        return location
    return pointer.read_text().strip()


def exists(location: Location, field: str = "path") -> bool:
    if is_local(location):
        return local_path(location, field).exists()
    fs, path = _fresh(location, field)
    return fs.exists(path)


def is_file(location: Location, field: str = "path") -> bool:
    if is_local(location):
        return local_path(location, field).is_file()
    fs, path = _fresh(location, field)
    return fs.isfile(path)


def is_dir(location: Location, field: str = "path") -> bool:
    """A folder; on object storage, any prefix with an object under it."""
    if is_local(location):
        return local_path(location, field).is_dir()
    fs, path = _fresh(location, field)
    return fs.isdir(path)


def list_dirs(location: Location) -> list[str]:
    """Names of the sub-folders of ``location`` (empty when it does not exist)."""
    if is_local(location):
        folder = local_path(location)
        return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
    fs, path = _fresh(location)
    try:
        entries = fs.ls(path, detail=True)
    except FileNotFoundError:
        return []
    return [name_of(entry["name"]) for entry in entries if entry["type"] == "directory"]


def open_file(location: Location, mode: str = "rb") -> IO[Any]:
    if is_local(location):
        return open(local_path(location), mode)
    fs, path = resolve(location)
    return fs.open(path, mode)


def read_bytes(location: Location) -> bytes:
    if is_local(location):
        return local_path(location).read_bytes()
    fs, path = resolve(location)
    return fs.cat_file(path)


def read_text(location: Location) -> str:
    return read_bytes(location).decode()


def write_bytes(location: Location, data: bytes) -> None:
    """Replace one file atomically: temp+fsync+rename locally, one PUT on object storage."""
    if is_local(location):
        atomic.write_bytes(local_path(location), data)
        return
    fs, path = resolve(location)
    fs.pipe_file(path, data)


def write_text(location: Location, text: str) -> None:
    write_bytes(location, text.encode())


def remove_file(location: Location) -> None:
    """Delete one file if it exists."""
    if is_local(location):
        local_path(location).unlink(missing_ok=True)
        return
    fs, path = resolve(location)
    if fs.exists(path):
        fs.rm_file(path)
    fs.invalidate_cache()


def remove_tree(location: Location) -> None:
    """Delete a folder and everything under it, if it exists."""
    if is_local(location):
        if (folder := local_path(location)).exists():
            shutil.rmtree(folder)
        return
    fs, path = resolve(location)
    if fs.exists(path):
        fs.rm(path, recursive=True)
    fs.invalidate_cache()


def sha256(location: Location) -> str:
    """sha256 of a file, read in chunks so memory stays bounded."""
    if is_local(location):
        return sha256_file(local_path(location))
    with open_file(location) as handle:
        return sha256_of_chunks(chunks_of(handle))


def folder_digests(root: Location, exclude: tuple[str, ...] = ()) -> dict[str, str]:
    """sha256 of every file under ``root``, keyed by its POSIX path relative to ``root``."""
    if is_local(root):
        folder = local_path(root)
        files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
        return {name: sha256_file(folder / name) for name in files if name not in exclude}
    fs, base = _fresh(root)
    base = base.rstrip("/")
    digests = {}
    for path in sorted(fs.find(base)):
        relative = path[len(base) + 1 :]
        if relative not in exclude:
            digests[relative] = sha256(join(root, relative))
    return digests


def retract(final: Location, manifest: str) -> None:
    """Remove an object-storage folder, its manifest first, so no reader trusts what remains."""
    remove_file(join(final, manifest))
    remove_tree(final)


def staging_dir(final: Location) -> Path:
    """A local folder to build ``final`` in: beside it when local (renamed into place), else a
    temporary folder uploaded by :func:`publish_dir` and then deleted."""
    if is_local(final):
        return atomic.staging_dir(local_path(final))
    import tempfile

    return Path(tempfile.mkdtemp(prefix=f"kubetrain-{name_of(final)}-"))


def publish_dir(
    staged: Path, final: Location, manifest: str, known_sha256: Mapping[str, str] | None = None
) -> Path | str:
    """Publish a fully written local folder at ``final``, so that it is complete or not seen.

    Locally: fsync and rename. On object storage: take down the manifest of an older folder
    first (its readers stop trusting it), remove its files, upload every file under its final
    key (streamed and verified, :func:`kubetrain.storage.verified_copy.copy_verified`) and
    the manifest last; the local staging folder is deleted afterwards. ``known_sha256`` (by
    POSIX path relative to ``staged``) gives files whose sha256 the caller already verified, so
    they are not read once more just to learn what their upload is checked against.
    """
    if is_local(final):
        return atomic.publish_dir(staged, local_path(final))
    try:
        retract(final, manifest)
        files = sorted(p for p in staged.rglob("*") if p.is_file())
        if staged / manifest not in files:
            raise IntegrityError(
                f"{final}: no {manifest} to publish it with (its staging folder {staged} is "
                "incomplete); run the step again"
            )
        for path in [p for p in files if p != staged / manifest]:
            relative = path.relative_to(staged).as_posix()
            # streamed, and published only once its sha256 matched the staged file's
            copy_verified(
                str(path), str(join(final, relative)),
                expected_sha256=(known_sha256 or {}).get(relative) or sha256_file(path),
            )  # fmt: skip
        fs, base = resolve(final)
        fs.put_file(str(staged / manifest), f"{base.rstrip('/')}/{manifest}")
        fs.invalidate_cache()
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return os.fspath(final)


def publish_new_dir(
    staged: Path, final: Location, manifest: str, known_sha256: Mapping[str, str] | None = None
) -> bool:
    """Publish like :func:`publish_dir`, but locally only where no folder with entries is yet
    (a plain rename): False, ``staged`` left to the caller, when one is. On object storage,
    where a folder without its manifest is absent to readers, as :func:`publish_dir`."""
    if is_local(final):
        return atomic.publish_new_dir(staged, local_path(final))
    publish_dir(staged, final, manifest, known_sha256)
    return True


def discard_staging(staged: Path) -> None:
    shutil.rmtree(staged, ignore_errors=True)
