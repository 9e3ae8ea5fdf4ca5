"""Reading the ``manifest.json`` that says what a folder holds (a dataset, a checkpoint).

Every way a manifest can be unusable (missing, unreadable, not JSON, not an object, another
format) becomes one ``IntegrityError`` that names the folder and says what to do.
"""

from __future__ import annotations

import json
from typing import Any

from kubetrain import storage
from kubetrain.errors import IntegrityError

MANIFEST = "manifest.json"


def read_format_manifest(
    folder: storage.Location, expected_format: str, *, what: str, if_missing: str, if_foreign: str
) -> dict[str, Any]:
    """The JSON object in ``folder/manifest.json`` whose ``format`` is ``expected_format``.

    ``what`` names the folder in errors ("dataset DIR"); ``if_missing`` follows "no
    manifest.json" and ``if_foreign`` follows a wrong format, each saying what to do.
    """
    try:
        text = storage.read_text(storage.join(folder, MANIFEST))
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise IntegrityError(f"{what}: no {MANIFEST}{if_missing}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise IntegrityError(f"{what}: {MANIFEST} is unreadable ({exc})") from exc
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as exc:
        raise IntegrityError(f"{what}: {MANIFEST} is not valid JSON ({exc})") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != expected_format:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise IntegrityError(f"{what}: format {found!r} is not {expected_format!r}; {if_foreign}")
    return manifest
