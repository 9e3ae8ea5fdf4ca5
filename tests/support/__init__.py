"""Test support: an emulated Kubernetes API server and a fake Kubeflow Trainer controller that
runs what is submitted to it with the local backend (importable by tests and benchmarks)."""

from tests.support.emulator import KubeEmulator

__all__ = ["KubeEmulator"]
