"""What a training run may choose, importable without torch: the CLI (`kubetrain --help`),
launch and the pipeline-parameter checks refuse a bad choice before anything starts."""

STRATEGIES = ("ddp", "fsdp")
BUILTIN_MODELS = ("mlp", "cnn")
MODEL_FIX = "use mlp, cnn or package.module:callable"


def is_model_spec(spec: str) -> bool:
    """A built-in model, or a ``package.module:callable`` to import."""
    return spec in BUILTIN_MODELS or ":" in spec
