"""Compile every step's KFP component and the pipeline to YAML next to their sources."""

from __future__ import annotations

import importlib
from pathlib import Path

# step folder -> the component function in its component.py
COMPONENTS = {
    "dataset_prep": "dataset_prep",
    "launch_trainjob": "launch_trainjob",
    "wait_trainjob": "wait_trainjob",
    "collect_checkpoint": "collect_checkpoint",
    "evaluate_model": "evaluate_model",
}
PIPELINES = {"training_pipeline": "training_pipeline"}


def package_dir(package: str) -> Path:
    return Path(importlib.import_module(package).__file__).parent


def compile_all(
    components_dir: Path | None = None, pipelines_dir: Path | None = None
) -> list[Path]:
    """Write ``<components_dir>/<step>/component.yaml`` and
    ``<pipelines_dir>/compiled/<pipeline>.yaml``; defaults are the installed source folders."""
    from kfp import compiler

    components_dir = components_dir or package_dir("kubetrain.components")
    pipelines_dir = pipelines_dir or package_dir("kubetrain.pipelines")
    written = []
    for step, function in COMPONENTS.items():
        component = getattr(
            importlib.import_module(f"kubetrain.components.{step}.component"), function
        )
        target = components_dir / step / "component.yaml"
        target.parent.mkdir(parents=True, exist_ok=True)
        compiler.Compiler().compile(component, str(target))
        written.append(target)
    for module, function in PIPELINES.items():
        pipeline = getattr(importlib.import_module(f"kubetrain.pipelines.{module}"), function)
        target = pipelines_dir / "compiled" / f"{module}.yaml"
        target.parent.mkdir(parents=True, exist_ok=True)
        compiler.Compiler().compile(pipeline, str(target))
        written.append(target)
    return written
