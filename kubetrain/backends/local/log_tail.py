"""Follow a growing log file line by line, the way `kubectl logs -f` follows a container."""

from __future__ import annotations

from pathlib import Path


class LogTail:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""

    def read_lines(self, final: bool = False) -> list[str]:
        """New complete lines since the last call; with ``final`` also an unterminated last line."""
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
        except FileNotFoundError:
            chunk = b""
        self.offset += len(chunk)
        data = self.partial + chunk
        *lines, self.partial = data.split(b"\n")
        if final and self.partial:
            lines.append(self.partial)
            self.partial = b""
        return [line.decode(errors="replace").rstrip("\r") for line in lines]
