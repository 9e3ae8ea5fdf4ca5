"""The container images our steps and training jobs run in; override them with env vars."""

from __future__ import annotations

import os

#: Image of the pipeline steps (KFP components and Argo templates): python + kubetrain.
COMPONENT_IMAGE = os.environ.get(
    "KUBETRAIN_COMPONENT_IMAGE", "ghcr.io/kubetrain/kubetrain-components:0.1.0"
)
#: Image the TrainJob's `node` pods run: torch + kubetrain; they run
#: `torchrun -m kubetrain.train`.
TRAINER_IMAGE = os.environ.get(
    "KUBETRAIN_TRAINER_IMAGE", "ghcr.io/kubetrain/kubetrain-trainer:0.1.0"
)
