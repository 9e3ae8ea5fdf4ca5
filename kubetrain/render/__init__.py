"""Render a TrainJobSpec into Kubernetes objects: a Kubeflow Trainer ``TrainJob``, or an
Indexed Job + headless Service for clusters without the Trainer, plus the ConfigMap of a
shipped script. Pure functions: nothing here talks to a cluster.

The renderers load on first use: the pipeline definitions need only ``kubetrain.render.pod``'s
constants, and the Trainer API models behind ``render_trainjob`` take 0.4 s to import.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "render_indexed_job": "kubetrain.render.indexed_job",
    "render_script_configmap": "kubetrain.render.script",
    "render_trainjob": "kubetrain.render.trainjob",
}
__all__ = list(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
