"""The third-party script corpus (``tests/thirdparty/scripts``): training scripts written in the
styles of public examples nobody here wrote (each script's docstring names its upstream file),
what each one's collected model must say it came from, and how a user runs them: a project
folder holding the scripts, their ``netdef.py`` and a prepared dataset, and the ``kubetrain``
command of the venv the user has activated."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parent / "scripts"
#: The venv's bin folder: what a user's activated venv puts first on PATH.
VENV_BIN = Path(sys.executable).parent
KUBETRAIN = VENV_BIN / "kubetrain"
#: Few epochs: every script reaches > 0.9 on digits in 4 (> 0.8 is asserted).
EPOCHS = 4
NODES = 2
#: What each script writes in its working folder: rank 0's own score of its final model.
SCRIPT_ACCURACY = "script_accuracy.json"
#: The dataset's samples and classes (sklearn digits as conftest.write_digits and prep write
#: them), for building a factory's model to read its parameter names.
SAMPLE_SHAPE, NUM_CLASSES = [1, 8, 8], 10


def load_module(path: Path) -> ModuleType:
    """``path`` imported as a module of its own name (a project's script or netdef)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def only(paths: list[Path]) -> Path:
    assert len(paths) == 1, paths
    return paths[0]


def newest_numbered(folder: Path) -> str:
    """The name of the highest-numbered folder in ``folder`` (the FSDP2 example's save time)."""
    return str(max(int(path.name) for path in folder.iterdir() if path.name.isdigit()))


def kubeflow_sdk_command(project: Path) -> list[str]:
    """The TrainJob command kubeflow/sdk builds for ``CustomTrainer(func=train_fashion_mnist)``
    on a torch runtime, by the SDK's own code (kubeflow 0.5,
    ``kubeflow/trainer/backends/kubernetes/utils.py``): ``bash -c`` writing the function's
    source to ``kubeflow_sdk_function.py`` in the working folder and running it with torchrun."""
    from kubeflow.trainer import CustomTrainer
    from kubeflow.trainer.backends.kubernetes.utils import get_trainer_cr_from_custom_trainer
    from kubeflow.trainer.constants import constants
    from kubeflow.trainer.types import types

    trainer = types.RuntimeTrainer(
        trainer_type=types.TrainerType.CUSTOM_TRAINER, framework="torch", image="unused"
    )
    trainer.set_command(constants.TORCH_COMMAND)  # what a runtime with a torch policy gets
    runtime = types.Runtime(
        name="torch-distributed", trainer=trainer, kind=types.RuntimeKind.CLUSTER_TRAINING_RUNTIME
    )
    function = load_module(project / "kubeflow_sdk_function.py").train_fashion_mnist
    custom = CustomTrainer(func=function, func_args={"epochs": EPOCHS}, num_nodes=NODES)
    return list(get_trainer_cr_from_custom_trainer(runtime, custom).command)


#: The way each script is run in the suite (one each, for the suite's time): the whole
#: pipeline, or the steps one by one as a user types them.
KUBETRAIN_RUN = "kubetrain run"
STEP_BY_STEP = "launch/wait/collect/evaluate"


@dataclass(frozen=True)
class ThirdPartyScript:
    """One corpus script: how it is run and what collect must make of what it saved."""

    id: str
    through: str
    file: str
    args: tuple[str, ...]
    #: ``netdef:<callable>``: the factory evaluate rebuilds its model with.
    factory: str
    source_format: str
    #: The checkpoint folder → the ``source_file`` the card must name (relative to it).
    source_file: Callable[[Path], str]
    #: The project folder → the command every node runs; default ``torchrun FILE ARGS``.
    command_of: Callable[[Path], list[str]] | None = None

    def command(self, project: Path) -> list[str]:
        if self.command_of is not None:
            return self.command_of(project)
        return ["torchrun", self.file, *self.args]

    @property
    def script_option(self) -> list[str]:
        """``--script FILE`` when the nodes run a file of the project (the SDK's command
        carries its function's source instead)."""
        return [] if self.command_of is not None else ["--script", self.file]

    def model_keys(self) -> set[str]:
        """The parameter names of the factory's model: all a published model may hold."""
        module, _, name = self.factory.partition(":")
        build = getattr(load_module(SCRIPTS / f"{module}.py"), name)
        return set(build(SAMPLE_SHAPE, NUM_CLASSES).state_dict())


def _fsdp2(api: str, through: str) -> ThirdPartyScript:
    flags = ("--dcp-api",) if api == "dcp_api" else ()
    return ThirdPartyScript(
        id=f"fsdp2-{api.replace('_', '-')}",
        through=through,
        file="fsdp2_example.py",
        args=(*flags, "--epochs", str(EPOCHS)),
        factory="netdef:build_layered",
        source_format="torch-save",
        source_file=lambda folder: (
            f"checkpoints/{api}/{newest_numbered(folder / 'checkpoints' / api)}/model_state_dict.pt"
        ),
    )


def _lightning_checkpoint(folder: Path) -> str:
    checkpoint = only(list(folder.glob("lightning_logs/version_*/checkpoints/*.ckpt")))
    assert checkpoint.name.startswith(f"epoch={EPOCHS - 1}-step="), checkpoint
    return checkpoint.relative_to(folder).as_posix()


CORPUS = [
    ThirdPartyScript(
        id="ddp-snapshot",
        through=KUBETRAIN_RUN,
        file="ddp_snapshot.py",
        args=(str(EPOCHS), "1"),
        factory="netdef:build",
        source_format="torch-save-dict",
        source_file=lambda folder: "snapshot.pt",
    ),
    _fsdp2("dtensor_api", KUBETRAIN_RUN),
    _fsdp2("dcp_api", STEP_BY_STEP),
    ThirdPartyScript(
        id="dcp-recipe",
        through=KUBETRAIN_RUN,
        file="dcp_recipe.py",
        args=("--epochs", str(EPOCHS)),
        factory="netdef:build_toy",
        source_format="dcp",
        source_file=lambda folder: "checkpoint/.metadata",
    ),
    ThirdPartyScript(
        id="kubeflow-sdk",
        through=KUBETRAIN_RUN,
        file="kubeflow_sdk_function.py",
        args=(),
        factory="netdef:build_fashion",
        source_format="torch-save",
        source_file=lambda folder: "fashion_mnist_cnn.pt",
        command_of=kubeflow_sdk_command,
    ),
    ThirdPartyScript(
        id="lightning",
        through=STEP_BY_STEP,
        file="lightning_ddp.py",
        args=("--num-nodes", str(NODES), "--epochs", str(EPOCHS)),
        factory="netdef:build",
        source_format="lightning",
        source_file=_lightning_checkpoint,
    ),
    ThirdPartyScript(
        id="hf-sharded",
        through=STEP_BY_STEP,
        file="hf_sharded.py",
        args=("--epochs", str(EPOCHS)),
        factory="netdef:build",
        source_format="hf-sharded-safetensors",
        source_file=lambda folder: "model.safetensors.index.json",
    ),
]


def write_project(folder: Path, data: Path | None = None) -> Path:
    """A user's project folder: the corpus scripts and netdef.py, and a copy of the prepared
    dataset ``data`` as ``data/`` when given (the user names it relatively)."""
    shutil.copytree(SCRIPTS, folder, ignore=shutil.ignore_patterns("__pycache__"))
    if data is not None:
        shutil.copytree(data, folder / "data")
    return folder


def user_env(jobs: Path) -> dict[str, str]:
    """The environment of a user whose venv is activated, with the local backend's jobs under
    ``jobs`` and one thread per process (two nodes share the machine)."""
    return {
        **os.environ,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "VIRTUAL_ENV": str(VENV_BIN.parent),
        "KUBETRAIN_LOCAL_ROOT": str(jobs),
        "OMP_NUM_THREADS": "1",
    }


def kubetrain(project: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """``kubetrain ARGS`` typed in ``project``; a failure shows its output."""
    result = subprocess.run(
        [str(KUBETRAIN), *args], cwd=project, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, (
        f"kubetrain {args[0]} exited {result.returncode}\n{result.stdout[-3000:]}"
        f"\n{result.stderr[-3000:]}"
    )
    return result


def script_accuracy(checkpoint_dir: Path) -> float:
    return json.loads((checkpoint_dir / SCRIPT_ACCURACY).read_text())["accuracy"]
