"""kubetrain: reusable pipeline steps for distributed PyTorch training on Kubernetes."""

__version__ = "0.1.0"
