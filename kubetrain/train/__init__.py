"""The training entrypoint our image runs under torchrun or mpirun: DDP, FSDP2, DeepSpeed ZeRO."""
