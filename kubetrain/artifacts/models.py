"""Model specs: the built-in ``mlp`` and ``cnn``, or a user's ``package.module:callable``.

A spec plus the dataset's sample shape and class count is all that is needed to rebuild a
model, which is why checkpoints store exactly those three things. A stored spec naming custom
code is rebuilt only from the reader's explicit choice (:func:`rebuild_model`): code a record
names is not imported.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from kubetrain.artifacts.manifest import check_model_code
from kubetrain.callables import import_callable
from kubetrain.errors import InvalidInput, refusal_reason
from kubetrain.rules import MODEL_FIX

HIDDEN = 128


def mlp(sample_shape: Sequence[int], num_classes: int) -> nn.Module:
    """Flatten, two hidden ReLU layers: enough for digits and MNIST-sized inputs."""
    features = math.prod(sample_shape)
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(features, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, num_classes),
    )


def cnn(sample_shape: Sequence[int], num_classes: int) -> nn.Module:
    """Two padded conv blocks and adaptive pooling, so 8x8, 28x28 and 32x32 images all fit."""
    if len(sample_shape) != 3:
        raise InvalidInput(
            "--model",
            f"cnn needs [channels, height, width] samples, the data has {list(sample_shape)}",
            "use --model mlp or a package.module:callable that accepts this shape",
        )
    channels = sample_shape[0]
    return nn.Sequential(
        nn.Conv2d(channels, 32, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2, ceil_mode=True),
        nn.Conv2d(32, 64, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 2 * 2, num_classes),
    )


_BUILDERS: dict[str, Callable[[Sequence[int], int], nn.Module]] = {"mlp": mlp, "cnn": cnn}


def build_model(
    spec: str, sample_shape: Sequence[int], num_classes: int, option: str = "--model"
) -> torch.nn.Module:
    """Build the model ``spec`` names for inputs of ``sample_shape`` and ``num_classes`` outputs;
    ``option`` is where the user gave ``spec``, named by a refusal."""
    shape = [int(dim) for dim in sample_shape]
    if spec in _BUILDERS:
        return _BUILDERS[spec](shape, int(num_classes))
    if ":" not in spec:
        raise InvalidInput(option, f"unknown model {spec!r}", MODEL_FIX)
    factory = import_callable(spec, option, MODEL_FIX)
    try:
        model = factory(shape, int(num_classes))
    except SystemExit as exc:  # sys.exit() in a factory is not kubetrain's exit, nor success
        raise InvalidInput(
            option,
            f"{spec}({shape}, {int(num_classes)}) exited (SystemExit {exc.code!r})",
            "a model factory returns the model; it must not exit",
        ) from None
    except Exception as exc:  # the user's code: say so, not "a bug in kubetrain"
        raise InvalidInput(
            option,
            f"{spec}({shape}, {int(num_classes)}) raised {type(exc).__name__}: "
            f"{refusal_reason(exc)}",
            "fix that callable; it is called as callable(sample_shape, num_classes)",
        ) from exc
    if not isinstance(model, nn.Module):
        raise InvalidInput(
            option, f"{spec} returned {type(model).__name__}, not a torch.nn.Module", MODEL_FIX
        )
    return model


def build_classifier(spec: str, sample_shape: Sequence[int], num_classes: int) -> nn.Module:
    """The model ``--model`` names, to be trained: :func:`build_model`, then refused unless it
    can be the classifier trained (:func:`check_classifier`). Reading a checkpoint needs less
    (collect takes a factory's module for its tensor names alone), so only training asks it."""
    model = build_model(spec, sample_shape, num_classes)
    check_classifier(model, spec, [int(dim) for dim in sample_shape], int(num_classes), "--model")
    return model


#: What a model factory's model must do, the fix each refusal of :func:`check_classifier` names.
CLASSIFIER_FIX = (
    "the callable must return a torch.nn.Module with trainable parameters that maps a "
    "float32 batch [N, *sample_shape] to logits [N, num_classes]"
)
#: Samples in the trial batch: two, so that a model that squeezes the batch away is caught.
TRIAL_BATCH = 2


def check_classifier(
    model: nn.Module, spec: str, shape: list[int], num_classes: int, option: str
) -> None:
    """Refuse, as one line naming ``option``, a module that cannot be the classifier trained:
    one without trainable parameters (``torch.nn:Identity``; DDP refuses it mid-setup), or one
    whose forward on a zero batch of the data's samples (the trainer's inputs are float32)
    raises or gives no ``[N, num_classes]`` tensor (training stopped at its first step with an
    "internal error"). The trial runs in eval mode, without gradients, on the model's device,
    and puts each submodule's mode back: it changes neither weights nor running statistics."""
    if not any(parameter.requires_grad for parameter in model.parameters()):
        raise InvalidInput(
            option,
            f"{spec} returned {type(model).__name__}, a module with nothing to train",
            CLASSIFIER_FIX,
        )
    tensors = [*model.parameters(), *model.buffers()]
    batch = torch.zeros(TRIAL_BATCH, *shape, device=tensors[0].device)
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            output = model(batch)
    except Exception as exc:
        raise InvalidInput(
            option,
            f"{spec}'s model raised {type(exc).__name__} on a batch of shape {list(batch.shape)}: "
            f"{refusal_reason(exc)}",
            CLASSIFIER_FIX,
        ) from None
    finally:
        for module, training in modes:
            module.training = training
    expected = [TRIAL_BATCH, num_classes]
    if not isinstance(output, torch.Tensor) or list(output.shape) != expected:
        got = list(output.shape) if isinstance(output, torch.Tensor) else type(output).__name__
        raise InvalidInput(
            option,
            f"{spec}'s model maps a batch of shape {list(batch.shape)} to {got}, "
            f"not {expected} (a score per class)",
            CLASSIFIER_FIX,
        )


def rebuild_model(
    recorded: Mapping[str, Any], model_factory: str | None, what: str
) -> torch.nn.Module:
    """The model that ``what`` (a checkpoint, a collected model) records, built to take its
    weights: by ``model_factory`` when the caller names one (the explicit choice wins), else by
    the record's spec if it is built in; custom code only a record names is refused unimported
    (:func:`kubetrain.artifacts.manifest.check_model_code`)."""
    check_model_code(recorded["spec"], model_factory, what)
    shape, num_classes = recorded["sample_shape"], recorded["num_classes"]
    if model_factory:
        return build_model(model_factory, shape, num_classes, option="model_factory")
    return build_model(recorded["spec"], shape, num_classes)
