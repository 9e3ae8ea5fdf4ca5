"""The formats kubetrain reads and writes: the manifest rule every format shares, the prepared
dataset folder, the checkpoint (layout, manifest, writer/reader), the model card, the
safetensors header, exports, and where a step may publish (the output rule)."""
