"""``file://`` URLs as local paths, and telling paths from URLs, for the options that take
a path or a URL."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse

from kubetrain.errors import InvalidInput


def is_plain_path(location: str) -> bool:
    """A path, not a URL: told apart as fsspec.utils.get_protocol does (a protocol ends in
    "://" or "::"), without importing fsspec."""
    return "://" not in location and "::" not in location


def protocol_of(location: str) -> str:
    """The fsspec protocol of a location, "file" for a plain path."""
    if is_plain_path(location):
        return "file"
    from fsspec.utils import get_protocol

    return get_protocol(location)


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
