"""``--param NAME=VALUE``, as `argo submit -p` and `kfp run create` take parameters."""

from __future__ import annotations

from collections.abc import Collection

from kubetrain.errors import InvalidInput


def split_param(pair: str, declared: Collection[str], owner: str) -> tuple[str, str]:
    """``NAME=VALUE`` split, NAME checked against the parameters ``owner`` declares."""
    name, sep, value = pair.partition("=")
    if not sep:
        raise InvalidInput("--param", f"{pair!r} is not NAME=VALUE", "write --param nodes=4")
    if name not in declared:
        raise InvalidInput(
            "--param", f"the {owner} has no parameter {name!r}",
            f"use one of {', '.join(sorted(declared)) or '(none declared)'}",
        )  # fmt: skip
    return name, value
