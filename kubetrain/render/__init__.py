"""Render a TrainJobSpec into Kubernetes objects: a Kubeflow Trainer ``TrainJob``, or an
Indexed Job + headless Service for clusters without the Trainer, plus the ConfigMap of a
shipped script. Pure functions: nothing here talks to a cluster."""

from __future__ import annotations

from kubetrain.render.indexed_job import render_indexed_job
from kubetrain.render.script import render_script_configmap
from kubetrain.render.trainjob import render_trainjob

__all__ = ["render_indexed_job", "render_script_configmap", "render_trainjob"]
