"""B2 baseline, run with the Kubeflow SDK's own venv (bench/.sdk-venv): wait for a TrainJob
with ``TrainerClient.wait_for_job_status`` at its defaults (polling every 2 s)."""

import sys

from kubeflow.common.types import KubernetesBackendConfig
from kubeflow.trainer import TrainerClient


def main() -> None:
    kubeconfig, namespace, name = sys.argv[1:4]
    config = KubernetesBackendConfig(namespace=namespace, config_file=kubeconfig)
    client = TrainerClient(backend_config=config)
    job = client.wait_for_job_status(name, timeout=600)
    print(f"{name} {job.status}", flush=True)


if __name__ == "__main__":
    main()
