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
#: Image of the `kubetrain-deepspeed-mpi` runtime's pods (the trainer image plus sshd, OpenMPI,
#: deepspeed, mpi4py). Named by the runtime, not by a TrainJob: Trainer v2.3 gives a TrainJob's
#: image to the MPI launcher only, and the node pods must run the same one.
DEEPSPEED_IMAGE = "ghcr.io/kubetrain/kubetrain-deepspeed:0.1.0"
