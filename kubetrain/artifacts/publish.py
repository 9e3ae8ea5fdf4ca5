"""The one road by which a step publishes what it made: :func:`publish_verified`.

It takes only what both halves of the publish guard give (issue 28):

- a :class:`~kubetrain.artifacts.output_rule.CheckedOutput`, which only the output rule makes
  (``check_output``; promote's ``registry_version`` for a new registry version), so no output
  is published that the rule did not allow, a registry's published versions included;
- the sha256 of every file the step copied or wrote from its source, as
  :func:`~kubetrain.storage.verified_copy.copy_verified` checked it against the source's
  record, or the writer hashed it while writing. The folder's own marker records the same
  files with the same digests (a model's card its model file, a dataset's manifest its
  splits, a report's marker its page and charts), and each file is read once more and must
  still be what was verified, before anything is published or an earlier output taken down;
  on object storage every upload is checked against them again.

It has no option that skips a check. tests/test_publish_guard.py reads the source (ast) and
fails on any other use of the low-level publishing functions (``storage.publish_dir``,
``atomic.publish_dir``, a rename into place) outside ``kubetrain.storage``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from kubetrain import bounded_json, storage
from kubetrain.artifacts.manifest import is_sha256
from kubetrain.artifacts.model_card import EXPORT_CARD, MODEL_FILE
from kubetrain.artifacts.output_rule import DATASET, MODEL, CheckedOutput
from kubetrain.errors import IntegrityError
from kubetrain.storage.integrity import sha256_file

#: What every refusal of a staged output says: nothing of it is out, and what to do. A staged
#: folder that disagrees with itself was changed while the step ran, or is a bug of ours.
NOT_PUBLISHED = (
    "nothing was published: re-run the step with nothing else writing to its output (if "
    "it fails the same way again, report it as a kubetrain bug)"
)


def publish_verified(staged: Path, output: CheckedOutput, verified: Mapping[str, str]) -> bool:
    """Publish the staging folder ``staged`` at ``output`` once every file named in
    ``verified`` (POSIX path relative to ``staged`` -> sha256 checked as it was staged) is a
    file there with that sha256 still, and the folder's marker records exactly these files
    with these digests. An output that ``replaces`` replaces an earlier one; a registry
    version is published only where none is: False when one is (``staged`` is then left to
    the caller)."""
    if not isinstance(output, CheckedOutput):
        raise TypeError(f"publish_verified takes a CheckedOutput, not {type(output).__name__}")
    where = f"the {output.kind.name} for {output.location}"
    if not verified:
        raise IntegrityError(f"{where}: no verified file to publish; {NOT_PUBLISHED}")
    for name, digest in verified.items():
        if not is_sha256(digest) or not (staged / name).is_file():
            raise IntegrityError(
                f"{where}: {name} was not staged with a verified sha256; {NOT_PUBLISHED}"
            )
    recorded = _recorded(staged, output)
    for name, digest in recorded:
        if verified.get(name) != digest:
            raise IntegrityError(
                f"{where}: its {output.kind.marker} records sha256 {digest} for {name}, but "
                f"{verified.get(name, 'no digest')} was verified; {NOT_PUBLISHED}"
            )
    if unrecorded := sorted(set(verified) - {name for name, _ in recorded}):
        raise IntegrityError(
            f"{where}: {unrecorded[0]} was verified but its {output.kind.marker} does not "
            f"record it; {NOT_PUBLISHED}"
        )
    for name, digest in verified.items():
        if (now := sha256_file(staged / name)) != digest:
            raise IntegrityError(
                f"{where}: {name} changed after it was verified (sha256 {now}, verified "
                f"{digest}); {NOT_PUBLISHED}"
            )
    if output.replaces:
        storage.publish_dir(staged, output.location, output.kind.marker, verified)
        return True
    return storage.publish_new_dir(staged, output.location, output.kind.marker, verified)


def _export_records(staged: Path, what: str) -> list[tuple[object, object]]:
    """(file, sha256) of each program ``export.json`` records beside a model's card (none
    without it): an export is published only as verified as the model."""
    card = staged / EXPORT_CARD
    if not card.exists():
        return []
    try:
        exports = bounded_json.loads(card.read_text()).get("exports")
    except (OSError, ValueError, AttributeError) as exc:
        raise IntegrityError(
            f"{what}: its {EXPORT_CARD} cannot be read ({exc}); {NOT_PUBLISHED}"
        ) from None
    entries = exports.values() if isinstance(exports, dict) else [None]
    return [
        (entry.get("file"), entry.get("sha256")) if isinstance(entry, dict) else (None, None)
        for entry in entries
    ]


def _recorded(staged: Path, output: CheckedOutput) -> list[tuple[str, object]]:
    """(file, sha256) for each file the staged marker records: a model's card its model file,
    a dataset's manifest each split's file, a report's marker its ``sha256`` by file."""
    what = f"the {output.kind.name} for {output.location}: its {output.kind.marker}"
    marker = staged / output.kind.marker
    try:
        content = bounded_json.loads(marker.read_text())
    except (OSError, ValueError) as exc:
        raise IntegrityError(f"{what} cannot be read ({exc}); {NOT_PUBLISHED}") from None
    if not isinstance(content, dict) or content.get("format") != output.kind.format:
        raise IntegrityError(f"{what} is not of format {output.kind.format}; {NOT_PUBLISHED}")
    if output.kind == MODEL:
        records = [(MODEL_FILE, content.get("sha256")), *_export_records(staged, what)]
    elif output.kind == DATASET:
        splits = content.get("splits")
        entries = list(splits.values()) if isinstance(splits, dict) else []
        records = [
            (e.get("file"), e.get("sha256")) if isinstance(e, dict) else (None, None)
            for e in entries
        ]
    else:  # a report's marker
        digests = content.get("sha256")
        records = list(digests.items()) if isinstance(digests, dict) else []
    if not records or not all(isinstance(name, str) for name, _ in records):
        raise IntegrityError(f"{what} records no sha256 by file name; {NOT_PUBLISHED}")
    return records
