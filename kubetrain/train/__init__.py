"""The training entrypoint our DDP/FSDP image runs under torchrun."""
