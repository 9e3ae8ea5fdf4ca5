"""Kubernetes' `$(VAR)` references in a container's command and args, expanded as the kubelet does.

A TrainJob's command may name the environment the Trainer injects, e.g.
``--rdzv-endpoint=$(PET_MASTER_ADDR):$(PET_MASTER_PORT)``; on a cluster the kubelet expands it
(no shell involved). The local backend expands it the same way so the same command runs in
both places: ``$(NAME)`` becomes the variable's value when it is defined, stays as written
when it is not, and ``$$`` is an escaped ``$``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "$"
        return env.get(name, match.group(0))

    return _REFERENCE.sub(replace, text)


def expand_all(arguments: list[str], env: Mapping[str, str]) -> list[str]:
    return [expand(argument, env) for argument in arguments]
