"""The one output rule of every step that publishes a folder (collect, prep, evaluate's report,
the dataset staging copy): publishing replaces the target folder, so before any work it must be

- missing, or an empty folder, or an earlier output of the same kind, known by its format
  marker (a dataset's ``manifest.json``, a model's ``model.json``, a report's ``report.json``
  holding that kind's ``format``; a file of that name with other content is not ours);
- not an existing file;
- not one of the step's inputs, nor inside one, nor holding one (resolved real paths, symlinks
  included; on object storage, the same URL or a prefix of it);
- not a published version of a model registry (a folder beside the registry's ``PROMOTED``
  pointer) nor inside one: versions are immutable, and only ``kubetrain promote`` writes there.

Anything else is refused with one line naming the option, before anything is created. What
the rule allows comes back as a :class:`CheckedOutput`, which only this module makes and which
:func:`kubetrain.artifacts.publish.publish_verified`, the one road to publishing, requires.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath

from kubetrain import bounded_json, storage
from kubetrain.artifacts.model_card import (
    MODEL_CARD,
    MODEL_FORMAT,
    REGISTRY_POINTER,
    REGISTRY_POINTER_FORMAT,
)
from kubetrain.errors import InvalidInput


@dataclass(frozen=True)
class OutputKind:
    """What a step publishes: its name in messages and the marker file that identifies it."""

    name: str
    marker: str
    format: str


DATASET = OutputKind("dataset", "manifest.json", "kubetrain.dataset/v1")
MODEL = OutputKind("model", MODEL_CARD, MODEL_FORMAT)
REPORT = OutputKind("report", "report.json", "kubetrain.report/v1")
#: A marker larger than this is not one of ours (and is not read whole to find out).
_MARKER_LIMIT = 16 * 1024 * 1024


@dataclass(frozen=True)
class CheckedOutput:
    """A location a rule of this module allowed a ``kind`` to be published at: by
    :func:`check_output` (``replaces``: an earlier output of the kind is replaced), or by
    :func:`registry_version` (a registry version, never replaced)."""

    location: storage.Location
    kind: OutputKind
    replaces: bool


def check_output(
    location: storage.Location,
    field: str,
    kind: OutputKind,
    inputs: Mapping[str, storage.Location] | None = None,
) -> CheckedOutput:
    """Refuse ``location`` (the option ``field``) as the output of a step publishing a ``kind``
    whose inputs are ``inputs`` (option name -> location), unless the rule above allows it."""
    text = os.fspath(location) if isinstance(location, str | os.PathLike) else ""
    if not text.strip():
        raise InvalidInput(field, "is empty", f"give a folder to publish the {kind.name} in")
    storage.check_location(text, field)
    for input_field, source in (inputs or {}).items():
        if source is None or not os.fspath(source).strip():
            continue
        # a KFP artifact folder may stand for a URL (a LOCATION pointer): both are inputs
        for named in {os.fspath(source), os.fspath(storage.dereference(source))}:
            _check_apart(text, field, named, input_field)
    _check_not_a_registry_version(text, field)
    if storage.is_local(text):
        _check_local_target(text, field, kind)
    else:
        _check_remote_target(text, field, kind)
    return CheckedOutput(location, kind, replaces=True)


def registry_version(target: storage.Location) -> CheckedOutput:
    """A new version of a model registry, as ``kubetrain promote`` checked it (its name, its
    registry): the one output beside a ``PROMOTED`` pointer, published only where nothing is
    yet (a version is never replaced)."""
    return CheckedOutput(target, MODEL, replaces=False)


def is_output_of(location: storage.Location, kind: OutputKind) -> bool:
    """Whether ``location`` holds a marker file naming ``kind``'s format."""
    return _holds_marker(location, kind.marker, kind.format)


@dataclass(frozen=True)
class EnclosingVersion:
    """A registry version that a location is (``inside`` False) or lies inside."""

    registry: storage.Location
    version: storage.Location
    inside: bool

    def describe(self, location: storage.Location) -> str:
        where = "inside the version" if self.inside else "the version"
        return (
            f"{location} is {where} {storage.name_of(self.version)} of the model registry "
            f"{self.registry} (it holds {REGISTRY_POINTER}), and a version is never changed"
        )


def enclosing_version(location: storage.Location, field: str = "path") -> EnclosingVersion | None:
    """The model registry version (a folder whose parent holds a ``PROMOTED`` pointer) that
    ``location`` is or lies inside, else None. Locally the real path (links resolved, also of
    a folder not yet made); on object storage one look for the pointer per ancestor prefix,
    the bucket included."""
    if storage.is_local(location):
        path = storage.local_path(location, field).resolve()
        chain: list[storage.Location] = [path, *path.parents]
    else:
        protocol, _, rest = os.fspath(location).partition("://")
        segments = [segment for segment in rest.split("/") if segment]
        chain = [f"{protocol}://{'/'.join(segments[:end])}" for end in range(len(segments), 0, -1)]
    for depth, (version, registry) in enumerate(zip(chain, chain[1:], strict=False)):
        if _holds_marker(registry, REGISTRY_POINTER, REGISTRY_POINTER_FORMAT):
            return EnclosingVersion(registry, version, inside=depth > 0)
    return None


def _check_not_a_registry_version(text: str, field: str) -> None:
    """Refuse a registry's version (a promoted one, or one a promote will publish), whose model
    card is a model's like any collect output, and any folder inside one."""
    if found := enclosing_version(text, field):
        raise InvalidInput(
            field,
            found.describe(text),
            "give a folder outside the registry; `kubetrain promote` publishes new versions",
        )


def _holds_marker(location: storage.Location, name: str, format_id: str) -> bool:
    """Whether ``location`` holds a JSON file ``name`` whose ``format`` is ``format_id``."""
    marker = storage.join(location, name)
    try:
        if storage.is_local(location):
            path = storage.local_path(marker)
            if not path.is_file() or path.stat().st_size > _MARKER_LIMIT:
                return False
            text = path.read_bytes()
        else:
            fs, key = storage.resolve(marker)
            fs.invalidate_cache()
            if not fs.isfile(key) or fs.size(key) > _MARKER_LIMIT:
                return False
            text = fs.cat_file(key)
        content = bounded_json.loads(text)
    except (OSError, ValueError):
        return False
    return isinstance(content, dict) and content.get("format") == format_id


def _check_local_target(text: str, field: str, kind: OutputKind) -> None:
    path = storage.local_path(text, field)
    if path.is_symlink() and not path.exists():
        raise InvalidInput(
            field, f"{path} is a broken symbolic link", "give a folder path, not a link"
        )
    if not path.exists():
        return
    if not path.is_dir():
        raise InvalidInput(
            field,
            f"{path} is an existing file, not a folder to publish the {kind.name} in",
            "give a new folder path",
        )
    if _has_entries(path) and not is_output_of(path, kind):
        raise InvalidInput(
            field,
            f"{path} is a non-empty folder that is not a kubetrain {kind.name} (no "
            f"{kind.marker} of format {kind.format}), and publishing would replace it",
            "give a new or empty folder, or an earlier output of this step",
        )


def _has_entries(path: os.PathLike[str]) -> bool:
    with os.scandir(path) as entries:
        return next(entries, None) is not None


def _check_remote_target(url: str, field: str, kind: OutputKind) -> None:
    if storage.is_file(url, field):
        raise InvalidInput(
            field,
            f"{url} is an existing object, and the {kind.name} is published as a prefix there",
            "give a new prefix",
        )
    if storage.is_dir(url, field) and not is_output_of(url, kind):
        raise InvalidInput(
            field,
            f"{url} holds objects but no kubetrain {kind.name} (no {kind.marker} of format "
            f"{kind.format}), and publishing would replace them",
            "give a new or empty prefix, or an earlier output of this step",
        )


def _check_apart(output: str, field: str, source: str, input_field: str) -> None:
    """Refuse an output that is, holds or lies inside the input ``source``."""
    if storage.is_local(output) != storage.is_local(source):
        return  # a local folder and an object-storage prefix cannot overlap
    out, src = _comparable(output, field), _comparable(source, input_field)
    if out == src:
        relation = "is"
    elif src in out.parents:
        relation = "lies inside"
    elif out in src.parents:
        relation = "holds"
    else:
        return
    raise InvalidInput(
        field,
        f"{output} {relation} the {input_field} {source}, which publishing would replace",
        f"give a folder apart from the {input_field}",
    )


def _comparable(location: str, field: str) -> PurePosixPath:
    """A local location's real path (symlinks resolved, also of a folder not yet made), or a
    URL as ``/protocol/bucket/key...`` so that prefixes compare by whole segments."""
    if storage.is_local(location):
        return PurePosixPath(os.path.realpath(storage.local_path(location, field)))
    fs, path = storage.resolve(location, field)
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return PurePosixPath("/", protocol, *[part for part in path.split("/") if part])
