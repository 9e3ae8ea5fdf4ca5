"""This folder installed as the package ``kubetrain.runtimes`` (pyproject.toml's package-dir),
so a wheel carries our ClusterTrainingRuntimes without a second copy of them in git; read them
with ``kubetrain.render.manifests.runtime_manifests()``."""
