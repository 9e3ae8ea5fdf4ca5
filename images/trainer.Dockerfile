# The image the TrainJob's `node` pods run: CUDA torch + kubetrain, so the runtimes' command
# (`torchrun -m kubetrain.train ...`) and the `kubetrain` CLI run as they are. No ENTRYPOINT:
# the Trainer sets the container's command.
#
#   docker build -f images/trainer.Dockerfile -t ghcr.io/kubetrain/kubetrain-trainer:0.1.0 .
#
# The base is the image Kubeflow Trainer v2.3's own torch-distributed runtime uses (pinned tag;
# pin its digest too when you mirror it).
FROM pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# torch comes from the base image (its CUDA build satisfies the `train` extra's torch>=2.6, so
# pip keeps it); the extra adds numpy, scikit-learn, safetensors and matplotlib. The `ray`
# extra (ray[default,train]==2.60.0) lets the same image run a KubeRay RayJob's head and worker
# pods (`--backend rayjob`: KubeRay runs `ray start` in them) and `python -m kubetrain.train.ray`.
COPY pyproject.toml README.md /tmp/kubetrain/
COPY kubetrain /tmp/kubetrain/kubetrain
COPY components /tmp/kubetrain/components
COPY pipelines /tmp/kubetrain/pipelines
RUN python -m pip install "/tmp/kubetrain[train,ray]" \
    && python -c "import kubetrain.train, torch, ray; print('kubetrain on torch', torch.__version__, 'ray', ray.__version__)" \
    && rm -rf /tmp/kubetrain

# A fixed numeric uid/gid, matching the runtimes' securityContext (runAsUser/fsGroup 10001),
# so runAsNonRoot can verify it and the shared PVC is writable.
RUN groupadd --gid 10001 kubetrain \
    && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/kubetrain \
        --shell /usr/sbin/nologin kubetrain \
    && mkdir -p /workspace /mnt/shared \
    && chown 10001:10001 /workspace /mnt/shared
ENV HOME=/home/kubetrain

USER 10001:10001
# A shipped --script is mounted here (read-only, from its ConfigMap).
WORKDIR /workspace
