"""A model name that imports but makes no classifier for the data is one line naming --model
and what the callable must return, before training starts (issue 28: a module without
parameters, or one of the wrong input or output shape, was an "internal error" at the
first step)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from kubetrain.artifacts.models import CLASSIFIER_FIX, build_classifier, build_model
from kubetrain.errors import InvalidInput

# --- factories, importable as test_model_factories:... in this process -------------------------


def five_scores(sample_shape: list[int], num_classes: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 5))


def wrong_input(sample_shape: list[int], num_classes: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(10, num_classes))


class ListOutput(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [self.linear(x.flatten(1))]


def list_output(sample_shape: list[int], num_classes: int) -> nn.Module:
    return ListOutput(num_classes)


def squeezed(sample_shape: list[int], num_classes: int) -> nn.Module:
    """The batch and class dimensions flattened into one: [N * num_classes]."""
    return nn.Sequential(nn.Flatten(), nn.Linear(64, num_classes), nn.Flatten(0))


def frozen(sample_shape: list[int], num_classes: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, num_classes).requires_grad_(False))


def with_batchnorm(sample_shape: list[int], num_classes: int) -> nn.Module:
    """Running statistics, dropout and a submodule deliberately left in eval mode."""
    kept_eval = nn.Dropout(0.5).eval()
    return nn.Sequential(
        nn.Flatten(), nn.Linear(64, 16), nn.BatchNorm1d(16), nn.Dropout(0.5), kept_eval,
        nn.Linear(16, num_classes),
    )  # fmt: skip


def holder(sample_shape: list[int], num_classes: int) -> nn.Module:
    module = nn.Module()
    module.model = nn.Sequential(nn.Flatten(), nn.Linear(64, num_classes))
    return module


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        (
            "torch.nn:Identity",
            "torch.nn:Identity returned Identity, a module with nothing to train",
        ),
        ("torch.nn:Flatten", "torch.nn:Flatten returned Flatten, a module with nothing to train"),
        ("test_model_factories:frozen", "returned Sequential, a module with nothing to train"),
        (
            "test_model_factories:five_scores",
            "test_model_factories:five_scores's model maps a batch of shape [2, 1, 8, 8] to "
            "[2, 5], not [2, 10] (a score per class)",
        ),
        (
            "test_model_factories:squeezed",
            "maps a batch of shape [2, 1, 8, 8] to [20], not [2, 10]",
        ),
        (
            "test_model_factories:list_output",
            "maps a batch of shape [2, 1, 8, 8] to list, not [2, 10]",
        ),
        (
            "test_model_factories:wrong_input",
            "test_model_factories:wrong_input's model raised RuntimeError on a batch of shape "
            "[2, 1, 8, 8]: mat1 and mat2 shapes cannot be multiplied",
        ),
    ],
)
def test_a_module_that_is_no_classifier_for_the_data_is_refused(spec: str, problem: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        build_classifier(spec, [1, 8, 8], 10)
    assert refused.value.field == "--model"
    assert problem in str(refused.value) and CLASSIFIER_FIX in str(refused.value)
    assert "\n" not in str(refused.value)


def test_the_trial_batch_changes_no_weights_statistics_or_modes() -> None:
    torch.manual_seed(0)
    expected = with_batchnorm([1, 8, 8], 10)
    torch.manual_seed(0)
    model = build_classifier("test_model_factories:with_batchnorm", [1, 8, 8], 10)
    for (name, ours), (_, theirs) in zip(
        model.state_dict().items(), expected.state_dict().items(), strict=True
    ):
        assert torch.equal(ours, theirs), name
    assert [module.training for module in model.modules()] == [
        module.training for module in expected.modules()
    ]
    assert model.training and not model[4].training, "the eval-mode submodule stays in eval"


def test_reading_a_checkpoint_still_takes_a_module_for_its_tensor_names_alone() -> None:
    """collect --model-factory builds a module for the names and shapes of its tensors: one
    without a forward (a holder of the real model) is no refusal there."""
    holder = build_model("test_model_factories:holder", [1, 8, 8], 10)
    assert list(holder.state_dict()) == ["model.1.weight", "model.1.bias"]


def test_the_trainer_refuses_it_in_one_line_before_any_checkpoint(
    tmp_path: Path, digits_dir: Path
) -> None:
    (tmp_path / "nets.py").write_text(
        "from torch import nn\n\n"
        "def build(shape, classes):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(64, 5))\n"
    )
    checkpoints = tmp_path / "checkpoints"
    result = subprocess.run(
        [sys.executable, "-m", "kubetrain.train", "--data", str(digits_dir), "--epochs", "1"]
        + ["--model", "nets:build", "--checkpoint-dir", str(checkpoints)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert line == (
        "kubetrain.train: error: --model: nets:build's model maps a batch of shape "
        f"[2, 1, 8, 8] to [2, 5], not [2, 10] (a score per class); {CLASSIFIER_FIX}"
    )
    assert not list(checkpoints.glob("epoch-*"))
