"""The one road by which a step publishes what it made: :func:`publish_verified`.

It takes only what both halves of the publish guard give (issue 28):

- a :class:`~kubetrain.artifacts.output_rule.CheckedOutput`, which only the output rule makes
  (``check_output``; promote's ``registry_version`` for a new registry version), so no output
  is published that the rule did not allow, a registry's published versions included;
- the sha256 of every file the step copied or wrote from its source, as
  :func:`~kubetrain.storage.verified_copy.copy_verified` checked it against the source's
  record, or the writer hashed it while writing; the folder's own record (a model's card)
  must agree with them, and on object storage every upload is checked against them again.

It has no option that skips a check. tests/test_publish_guard.py reads the source (ast) and
fails on any other use of the low-level publishing functions (``storage.publish_dir``,
``atomic.publish_dir``, a rename into place) outside ``kubetrain.storage``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from kubetrain import bounded_json, storage
from kubetrain.artifacts.manifest import is_sha256
from kubetrain.artifacts.model_card import MODEL_FILE
from kubetrain.artifacts.output_rule import MODEL, CheckedOutput
from kubetrain.errors import IntegrityError


def publish_verified(staged: Path, output: CheckedOutput, verified: Mapping[str, str]) -> bool:
    """Publish the staging folder ``staged`` at ``output`` once every file named in
    ``verified`` (POSIX path relative to ``staged`` -> sha256 checked as it was staged) is a
    file there and the folder's marker records the same digests. An output that ``replaces``
    replaces an earlier one; a registry version is published only where none is: False when
    one is (``staged`` is then left to the caller)."""
    if not isinstance(output, CheckedOutput):
        raise TypeError(f"publish_verified takes a CheckedOutput, not {type(output).__name__}")
    where = f"the {output.kind.name} for {output.location}"
    if not verified:
        raise IntegrityError(f"{where}: no verified file to publish; nothing was published")
    for name, digest in verified.items():
        if not is_sha256(digest) or not (staged / name).is_file():
            raise IntegrityError(
                f"{where}: {name} was not staged with a verified sha256; nothing was published"
            )
    for name, digest in _recorded(staged, output).items():
        if verified.get(name) != digest:
            raise IntegrityError(
                f"{where}: its {output.kind.marker} records sha256 {digest} for {name}, but "
                f"{verified.get(name, 'no digest')} was verified; nothing was published"
            )
    if output.replaces:
        storage.publish_dir(staged, output.location, output.kind.marker, verified)
        return True
    return storage.publish_new_dir(staged, output.location, output.kind.marker, verified)


def _recorded(staged: Path, output: CheckedOutput) -> dict[str, str]:
    """The digests the staged marker records, by file: a model's card records its model's."""
    marker = staged / output.kind.marker
    try:
        content = bounded_json.loads(marker.read_text())
    except (OSError, ValueError) as exc:
        raise IntegrityError(
            f"the {output.kind.name} for {output.location}: its {output.kind.marker} cannot be "
            f"read ({exc}); nothing was published"
        ) from None
    if not isinstance(content, dict) or content.get("format") != output.kind.format:
        raise IntegrityError(
            f"the {output.kind.name} for {output.location}: its {output.kind.marker} is not of "
            f"format {output.kind.format}; nothing was published"
        )
    return {MODEL_FILE: content.get("sha256")} if output.kind == MODEL else {}
