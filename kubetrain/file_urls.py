"""``file://`` URLs as local paths, for the options that take a path or a file URL."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse

from kubetrain.errors import InvalidInput


def file_url_path(url: str, field: str) -> Path:
    """``file:///abs/path`` (or ``file://localhost/...``) as a local path; ``field`` names the
    option in the error when the URL points at another host or has no path."""
    parsed = urlparse(url)
    if parsed.netloc not in ("", "localhost") or not parsed.path:
        raise InvalidInput(
            field,
            f"{url!r} is not a local file URL",
            "write it as file:///absolute/path (three slashes) or give a plain path",
        )
    return Path(unquote(parsed.path))
