# The image the pipeline steps (KFP components, Argo templates) run in: Python + kubetrain +
# kfp, so components never `pip install` at run time (install_kfp_package=False).
#
#   docker build -f images/components.Dockerfile -t ghcr.io/kubetrain/kubetrain-components:0.1.0 .
#
# Pinned base tag (pin its digest too when you mirror it).
FROM python:3.11.14-slim-bookworm

ARG TORCH_VERSION=2.13.0

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The steps need torch only on CPU (collect, evaluate): take the CPU build, not the CUDA one,
# before kubetrain[train] (which then keeps it).
RUN python -m pip install --index-url https://download.pytorch.org/whl/cpu "torch==${TORCH_VERSION}"

COPY pyproject.toml README.md /tmp/kubetrain/
COPY kubetrain /tmp/kubetrain/kubetrain
COPY components /tmp/kubetrain/components
COPY pipelines /tmp/kubetrain/pipelines
# The `train` extra: prep, collect and evaluate need torch, numpy, scikit-learn, safetensors
# and matplotlib (the base install only compiles, renders, submits and drives cluster jobs).
RUN python -m pip install "/tmp/kubetrain[train]" kfp \
    && python -c "import kfp, torch, kubetrain.components.launch_trainjob.component" \
    && rm -rf /tmp/kubetrain

RUN groupadd --gid 10001 kubetrain \
    && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/kubetrain \
        --shell /usr/sbin/nologin kubetrain
ENV HOME=/home/kubetrain

USER 10001:10001
WORKDIR /home/kubetrain
