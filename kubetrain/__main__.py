from kubetrain.cli import entrypoint

entrypoint()
