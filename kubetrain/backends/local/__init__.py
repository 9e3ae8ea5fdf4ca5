"""The local backend: a job as one process tree per node on this machine, with exactly the
PET_* environment Kubeflow Trainer injects (master 127.0.0.1)."""
