"""Validation by class (issue 14, item 6): every validated field, fed each class of bad value,
through the CLI a user runs.

Cases are generated: for each name-like field, the classes a Kubernetes rule refuses (a
trailing newline, which ``re.match`` with ``$`` let through, uppercase, too long, a leading dash,
unicode...); quantities, image references, tolerations, volumes, int32 bounds, learning rates;
the same parameters given to `submit kfp|argo`; files that cannot be read whole (a device, a
FIFO); and what the local backend's nodes would refuse (a model that does not import, a folder
that is no dataset, a checkpoint folder that is a file). Each must exit 2 with the one line
``kubetrain CMD: error: FIELD: PROBLEM; FIX`` and create nothing: no object or write on the
emulated API server, no request to the Argo or KFP server, no file, no local job folder.
Accepted forms are checked to pass the same rules.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# The harness of the bad-input catalogue: its servers, fixtures and assertions.
import test_bad_input as catalogue
from test_bad_input import (
    ARGO,
    ARGO_ENV,
    KFP,
    LOCAL,
    TRAINER,
    assert_one_line_error,
    run_creating_nothing,
)

from kubetrain import rules
from kubetrain.cli import main
from kubetrain.cli.param_option import check_value
from kubetrain.errors import InvalidInput
from tests.support.argo_server import ArgoServer

#: The Argo Server and the recording KFP API of the catalogue, as fixtures of this module.
argo = catalogue.argo
kfp_url = catalogue.kfp_url
REPO = Path(__file__).resolve().parents[2]
INT32_OVER = str(2**31)
LAUNCH, SUBMIT, RENDER = "kubetrain launch", "kubetrain submit", "kubetrain render"


@dataclass(frozen=True)
class Refusal:
    """``argv`` after ``kubetrain`` ({placeholders}: see ``places``), the ``field`` the line
    must start with, the ``prog`` it names; ``env`` set and ``cwd`` entered for the run."""

    argv: tuple[str, ...]
    field: str
    prog: str
    env: tuple[tuple[str, str], ...] = ()
    cwd: str = ""


def refusal(id: str, field: str, prog: str, *argv: str, **extra: Any) -> Any:
    return pytest.param(Refusal(argv, field, prog, **extra), id=id, marks=pytest.mark.bad_input)


# ------------------------------------------------------------------ names, by class of value
#: Bad values of each kind of name, made from a valid one: (class, make(valid)).
_COMMON: list[tuple[str, Callable[[str], str]]] = [
    ("trailing-newline", lambda v: v + "\n"),
    ("unicode", lambda v: v + "ü"),
    ("inner-space", lambda v: v[:1] + " " + v[1:]),
]
_DNS = [
    ("uppercase", str.upper),
    ("leading-dash", lambda v: "-" + v),
    ("trailing-dash", lambda v: v + "-"),
]
BAD_NAMES: dict[str, list[tuple[str, Callable[[str], str]]]] = {
    "dns1035": [*_COMMON, *_DNS, ("too-long", lambda v: "a" * 64), ("leading-digit", "1{}".format)],
    "dns1123-label": [*_COMMON, *_DNS, ("too-long", lambda v: "a" * 64), ("dot", "{}.x".format)],
    "dns1123-subdomain": [
        *_COMMON, *_DNS, ("too-long", lambda v: ".".join(["a" * 63] * 4)),
        ("underscore", "{}_x".format),
    ],
    "qualified-name": [
        *_COMMON, ("leading-dash", lambda v: "-" + v), ("trailing-dash", lambda v: v + "-"),
        ("too-long", lambda v: "a" * 64), ("two-slashes", "x/{}/y".format),
        ("uppercase-prefix", "Example.com/{}".format),
    ],
    "label-value": [
        *_COMMON, ("leading-dash", lambda v: "-" + v), ("trailing-dash", lambda v: v + "-"),
        ("too-long", lambda v: "a" * 64),
    ],
    "env-var-name": [*_COMMON, ("leading-digit", "1{}".format)],
    "generate-name": [
        *_COMMON, ("uppercase", str.upper), ("leading-dash", lambda v: "-" + v),
        ("too-long", lambda v: "a" * 59), ("underscore", "x_{}".format),
    ],
}  # fmt: skip

#: (id, field, prog, kind, valid value, argv(value)) of every name-like field.
NAME_FIELDS: list[tuple[str, str, str, str, str, Callable[[str], tuple[str, ...]]]] = [
    ("launch-name", "name", LAUNCH, "dns1035", "digits-ddp",
     lambda v: (*TRAINER, f"--name={v}")),
    ("launch-namespace", "namespace", LAUNCH, "dns1123-label", "team-a",
     lambda v: (*TRAINER, f"--namespace={v}")),
    ("launch-runtime", "runtime", LAUNCH, "dns1123-subdomain", "torch-distributed",
     lambda v: (*TRAINER, f"--runtime={v}")),
    ("launch-service-account", "service_account", LAUNCH, "dns1123-subdomain", "kubetrain",
     lambda v: (*TRAINER, f"--service-account={v}")),
    ("launch-storage-secret", "storage_secret", LAUNCH, "dns1123-subdomain", "s3-creds",
     lambda v: (*TRAINER, f"--storage-secret={v}")),
    ("launch-dataset-secret", "dataset_initializer.secret_name", LAUNCH, "dns1123-subdomain",
     "hf-token", lambda v: (*TRAINER, "--dataset-uri=hf://org/data", f"--dataset-secret={v}")),
    ("launch-volume-name", "volumes.name", LAUNCH, "dns1123-label", "shared",
     lambda v: (*TRAINER, f"--volume={v}=pvc:/mnt/x")),
    ("launch-volume-claim", "volumes.claim_name", LAUNCH, "dns1123-subdomain", "shared-pvc",
     lambda v: (*TRAINER, f"--volume=shared={v}:/mnt/x")),
    ("launch-label-key", "labels", LAUNCH, "qualified-name", "team",
     lambda v: (*TRAINER, f"--label={v}=ml")),
    ("launch-label-value", "labels", LAUNCH, "label-value", "ml",
     lambda v: (*TRAINER, f"--label=team={v}")),
    ("launch-pod-label-key", "pod_labels", LAUNCH, "qualified-name", "example.com/team",
     lambda v: (*TRAINER, f"--pod-label={v}=ml")),
    ("launch-pod-label-value", "pod_labels", LAUNCH, "label-value", "ml",
     lambda v: (*TRAINER, f"--pod-label=team={v}")),
    ("launch-node-selector-key", "node_selector", LAUNCH, "qualified-name",
     "nvidia.com/gpu.product", lambda v: (*TRAINER, f"--node-selector={v}=H100")),
    ("launch-node-selector-value", "node_selector", LAUNCH, "label-value", "H100",
     lambda v: (*TRAINER, f"--node-selector=nvidia.com/gpu.product={v}")),
    ("launch-toleration-key", "tolerations.key", LAUNCH, "qualified-name", "nvidia.com/gpu",
     lambda v: (*TRAINER, f"--toleration={v}:NoSchedule")),
    ("launch-toleration-value", "tolerations.value", LAUNCH, "label-value", "training",
     lambda v: (*TRAINER, f"--toleration=dedicated={v}:NoExecute")),
    ("launch-env-name", "env", LAUNCH, "env-var-name", "NCCL_DEBUG",
     lambda v: (*TRAINER, f"--env={v}=INFO")),
    ("argo-namespace", "--namespace", SUBMIT, "dns1123-label", "argo",
     lambda v: (*ARGO, f"--namespace={v}")),
    ("argo-generate-name", "--generate-name", SUBMIT, "generate-name", "digits-fsdp-",
     lambda v: (*ARGO, f"--generate-name={v}")),
    ("argo-from-template", "--from-template", SUBMIT, "dns1123-label", "kubetrain-training",
     lambda v: (*ARGO, f"--from-template={v}")),
    ("argo-param-runtime", "--param runtime", SUBMIT, "dns1123-subdomain", "torch-distributed",
     lambda v: (*ARGO, "--param", f"runtime={v}")),
    ("argo-param-service-account", "--param service_account", SUBMIT, "dns1123-subdomain",
     "kubetrain", lambda v: (*ARGO, "--param", f"service_account={v}")),
    ("argo-param-storage-secret", "--param storage_secret", SUBMIT, "dns1123-subdomain",
     "s3-creds", lambda v: (*ARGO, "--param", f"storage_secret={v}")),
    ("kfp-namespace", "--namespace", SUBMIT, "dns1123-label", "team-a",
     lambda v: (*KFP, f"--namespace={v}")),
    ("kfp-param-namespace", "--param namespace", SUBMIT, "dns1123-label", "default",
     lambda v: (*KFP, "--param", f"namespace={v}")),
    ("kfp-param-runtime", "--param runtime", SUBMIT, "dns1123-subdomain", "torch-distributed",
     lambda v: (*KFP, "--param", f"runtime={v}")),
    ("kfp-param-shared-pvc", "--param shared_pvc", SUBMIT, "dns1123-subdomain",
     "kubetrain-shared", lambda v: (*KFP, "--param", f"shared_pvc={v}")),
    ("kfp-param-service-account", "--param service_account", SUBMIT, "dns1123-subdomain",
     "kubetrain", lambda v: (*KFP, "--param", f"service_account={v}")),
    # the KFP pipeline's storage Secret is chosen at compile time (tests/test_pipeline.py)
]  # fmt: skip

NAME_REFUSALS = [
    refusal(f"{id}-{kind_class}", field, prog, *argv(make(valid)))
    for id, field, prog, kind, valid, argv in NAME_FIELDS
    for kind_class, make in BAD_NAMES[kind]
]

# --------------------------------------------------------------------------------- quantities
BAD_QUANTITIES = [
    ("negative", "-1"), ("unknown-suffix", "1Qi"), ("nan", "nan"), ("infinity", "inf"),
    ("trailing-newline", "1\n"), ("leading-space", " 1"), ("bytes-unit", "4GB"),
    ("uppercase-k", "1K"), ("underscore", "1_000"), ("arabic-digit", "١"), ("bare-exponent", "1e"),
    ("two-dots", "1..5"),
]  # fmt: skip
QUANTITY_FIELDS = [
    ("launch-cpu", "resources_per_node.cpu", LAUNCH, lambda v: (*TRAINER, f"--cpu={v}")),
    ("launch-memory", "resources_per_node.memory", LAUNCH, lambda v: (*TRAINER, f"--memory={v}")),
    ("argo-param-cpu", "--param cpu", SUBMIT, lambda v: (*ARGO, "--param", f"cpu={v}")),
    ("argo-param-memory", "--param memory", SUBMIT, lambda v: (*ARGO, "--param", f"memory={v}")),
]
QUANTITY_REFUSALS = [
    refusal(f"{id}-{name}", field, prog, *argv(value))
    for id, field, prog, argv in QUANTITY_FIELDS
    for name, value in BAD_QUANTITIES
]
GOOD_QUANTITIES = [".5", "100u", "1Gi", "500m", "2", "1e3", "+1", "1.", "0", "64Mi", "1.5Gi"]

# --------------------------------------------------------------------------- image references
DIGEST = "sha256:" + "0123456789abcdef" * 4
BAD_IMAGES = [
    ("uppercase-path", "ghcr.io/Org/trainer:1.0"), ("trailing-newline", "ghcr.io/org/t:1.0\n"),
    ("space", "ghcr.io/org/trainer 1.0"), ("empty-tag", "ghcr.io/org/trainer:"),
    ("tag-leading-dash", "ghcr.io/org/trainer:-1"), ("tag-too-long", "trainer:" + "a" * 129),
    ("short-digest", "ghcr.io/org/trainer@sha256:abc"), ("empty-component", "ghcr.io//trainer"),
    ("leading-dash", "-trainer"), ("unicode", "trainerü"), ("url", "https://ghcr.io/org/t"),
    ("name-too-long", "a/" + "b" * 255), ("triple-underscore", "org/a___b"),
]  # fmt: skip
IMAGE_FIELDS = [
    ("launch-image", "image", LAUNCH, lambda v: (*TRAINER, f"--image={v}")),
    ("argo-param-image", "--param image", SUBMIT, lambda v: (*ARGO, "--param", f"image={v}")),
    ("kfp-param-image", "--param image", SUBMIT, lambda v: (*KFP, "--param", f"image={v}")),
]
IMAGE_REFUSALS = [
    refusal(f"{id}-{name}", field, prog, *argv(value))
    for id, field, prog, argv in IMAGE_FIELDS
    for name, value in BAD_IMAGES
]
GOOD_IMAGES = [
    "ubuntu", "ghcr.io/org/trainer:1.0", "localhost:5000/team/trainer:v2", f"trainer@{DIGEST}",
    f"registry.example.com:443/a/b_c__d-e:1.0@{DIGEST}", "[::1]:5000/x:y", "Registry.io/a",
]  # fmt: skip

# --------------------------------------------------------------------------------- tolerations
TOLERATION_REFUSALS = [
    refusal(f"toleration-{id}", field, LAUNCH, *TRAINER, f"--toleration={text}")
    for id, field, text in [
        ("empty-key-with-value", "tolerations.key", "=training:NoSchedule"),
        ("key-two-slashes", "tolerations.key", "a/b/c:NoSchedule"),
        ("effect-unknown", "tolerations.effect", "dedicated=x:NoRun"),
        ("effect-lowercase", "tolerations.effect", "nvidia.com/gpu:noschedule"),
        ("effect-trailing-newline", "tolerations.effect", "nvidia.com/gpu:NoSchedule\n"),
        ("effect-with-colon", "tolerations.effect", "nvidia.com/gpu:NoSchedule:x"),
    ]
]
GOOD_TOLERATIONS = [
    "nvidia.com/gpu:NoSchedule", "dedicated=training:NoExecute", ":NoSchedule", "gpu",
    "dedicated=Training_A.1", "example.com/Key_1=v:PreferNoSchedule",
]  # fmt: skip

# ------------------------------------------------------------------------------------ volumes
VOLUME_REFUSALS = [
    refusal(f"volume-{id}", field, LAUNCH, *TRAINER, *argv)
    for id, field, argv in [
        ("duplicate-name", "volumes.name", ("--volume=a=c1:/mnt/a", "--volume=a=c2:/mnt/b")),
        ("duplicate-mount", "volumes.mount_path",
         ("--volume=a=c1:/mnt/a", "--volume=b=c2:/mnt/a/")),
        ("the-scripts-name", "volumes.name",
         ("--volume=kubetrain-script=c:/mnt/a", "--script={special}/train.py", "--",
          "torchrun", "train.py")),
        ("the-scripts-mount", "volumes.mount_path",
         ("--volume=code=c:/workspace", "--script={special}/train.py", "--", "torchrun",
          "train.py")),
        ("mount-backstep", "volumes.mount_path", ("--volume=a=c:/mnt/../etc",)),
        ("mount-relative", "volumes.mount_path", ("--volume=a=c:mnt/a",)),
        ("mount-nul", "volumes.mount_path", ("--volume=a=c:/mnt/a\0b",)),
    ]
]  # fmt: skip

# ------------------------------------------------------------------- int32 and other numbers
INT_REFUSALS = [
    refusal(id, field, prog, *argv)
    for id, field, prog, argv in [
        ("launch-nodes-int32", "nodes", LAUNCH, (*TRAINER, f"--nodes={INT32_OVER}")),
        ("launch-procs-int32", "procs_per_node", LAUNCH,
         (*TRAINER, f"--procs-per-node={INT32_OVER}")),
        ("launch-gpu-int32", "resources_per_node.gpu", LAUNCH, (*TRAINER, f"--gpu={INT32_OVER}")),
        ("launch-epochs-int32", "epochs", LAUNCH, (*TRAINER, f"--epochs={INT32_OVER}")),
        ("launch-batch-size-int32", "batch_size", LAUNCH,
         (*TRAINER, f"--batch-size={INT32_OVER}")),
        ("launch-checkpoint-every-int32", "checkpoint_every", LAUNCH,
         (*TRAINER, f"--checkpoint-every={INT32_OVER}")),
        ("launch-checkpoint-every-zero", "checkpoint_every", LAUNCH,
         (*TRAINER, "--checkpoint-every=0")),
        ("launch-max-restarts-over", "max_restarts", LAUNCH, (*TRAINER, "--max-restarts=101")),
        ("launch-deadline-int64", "active_deadline_seconds", LAUNCH,
         (*TRAINER, f"--active-deadline-seconds={2**63}")),
        ("render-nodes-int32", "nodes", RENDER, ("render", "trainjob", f"--nodes={INT32_OVER}")),
        ("argo-param-nodes-int32", "--param nodes", SUBMIT,
         (*ARGO, "--param", f"nodes={INT32_OVER}")),
        ("argo-param-procs-int32", "--param procs_per_node", SUBMIT,
         (*ARGO, "--param", f"procs_per_node={INT32_OVER}")),
        ("argo-param-epochs-int32", "--param epochs", SUBMIT,
         (*ARGO, "--param", f"epochs={INT32_OVER}")),
        ("argo-param-batch-size-int32", "--param batch_size", SUBMIT,
         (*ARGO, "--param", f"batch_size={INT32_OVER}")),
        ("argo-param-gpu-int32", "--param gpu", SUBMIT, (*ARGO, "--param", f"gpu={INT32_OVER}")),
        ("argo-param-gpu-negative", "--param gpu", SUBMIT, (*ARGO, "--param", "gpu=-1")),
        ("kfp-param-nodes-int32", "--param nodes", SUBMIT,
         (*KFP, "--param", f"nodes={INT32_OVER}")),
        ("kfp-param-procs-int32", "--param procs_per_node", SUBMIT,
         (*KFP, "--param", f"procs_per_node={INT32_OVER}")),
        ("kfp-param-epochs-int32", "--param epochs", SUBMIT,
         (*KFP, "--param", f"epochs={INT32_OVER}")),
        ("kfp-param-batch-size-int32", "--param batch_size", SUBMIT,
         (*KFP, "--param", f"batch_size={INT32_OVER}")),
        ("kfp-param-seed-uint32", "--param seed", SUBMIT, (*KFP, "--param", f"seed={2**32}")),
    ]
]  # fmt: skip
BAD_RATES = [
    ("nan", "nan"), ("infinity", "inf"), ("minus-infinity", "-inf"), ("zero", "0"),
    ("negative", "-1"), ("overflow", "1e400"), ("minus-zero", "-0.0"),
]  # fmt: skip
LR_REFUSALS = [
    refusal(f"{id}-lr-{name}", field, prog, *argv(value))
    for id, field, prog, argv in [
        ("launch", "lr", LAUNCH, lambda v: (*TRAINER, f"--lr={v}")),
        ("argo-param", "--param lr", SUBMIT, lambda v: (*ARGO, "--param", f"lr={v}")),
        ("kfp-param", "--param lr", SUBMIT, lambda v: (*KFP, "--param", f"lr={v}")),
    ]
    for name, value in BAD_RATES
]

# ------------------------------------------------------------- other submit string parameters
SUBMIT_REFUSALS = [
    refusal(id, field, SUBMIT, *argv)
    for id, field, argv in [
        ("argo-param-model-newline", "--param model", (*ARGO, "--param", "model=mlp\n")),
        ("argo-param-model-not-dotted", "--param model", (*ARGO, "--param", "model=a b:c")),
        ("argo-param-strategy-newline", "--param strategy", (*ARGO, "--param", "strategy=ddp\n")),
        ("argo-param-backend-case", "--param backend", (*ARGO, "--param", "backend=Trainer")),
        ("kfp-param-model-newline", "--param model", (*KFP, "--param", "model=cnn\n")),
        ("kfp-param-checkpoint-dir-protocol", "--param checkpoint_dir",
         (*KFP, "--param", "checkpoint_dir=ftp2://bucket/ckpt")),
        ("kfp-param-storage-protocol", "--param storage",
         (*KFP, "--param", "storage=ftp2://bucket/runs")),
        ("kfp-param-backend-newline", "--param backend", (*KFP, "--param", "backend=local\n")),
    ]
]  # fmt: skip

# ------------------------------------------------------------- files that cannot be read whole
READ_REFUSALS = [
    refusal(id, field, prog, *argv, **extra)
    for id, field, prog, argv, extra in [
        ("argo-token-file-device", "--token-file", SUBMIT,
         (*ARGO, "--token-file=/dev/zero"), {}),
        ("argo-token-file-fifo", "--token-file", SUBMIT, (*ARGO, "--token-file={special}/fifo"),
         {}),
        ("argo-token-file-folder", "--token-file", SUBMIT, (*ARGO, "--token-file={special}"), {}),
        ("argo-token-file-over-1mib", "--token-file", SUBMIT,
         (*ARGO, "--token-file={special}/big"), {}),
        ("argo-package-device", "--package", SUBMIT, (*ARGO, "--package=/dev/zero"), {}),
        ("argo-package-fifo", "--package", SUBMIT, (*ARGO, "--package={special}/fifo"), {}),
        ("kfp-package-device", "--package", SUBMIT, (*KFP, "--package=/dev/zero"), {}),
        ("kfp-package-fifo", "--package", SUBMIT, (*KFP, "--package={special}/fifo"), {}),
        ("launch-script-device", "script", LAUNCH,
         (*TRAINER, "--script=/dev/zero", "--", "torchrun", "zero"), {}),
        ("render-script-fifo", "script", RENDER,
         ("render", "trainjob", "--script={special}/fifo", "--", "torchrun", "fifo"), {}),
        ("launch-kubeconfig-fifo", "KUBECONFIG", LAUNCH, TRAINER,
         {"env": (("KUBECONFIG", "{special}/fifo"),)}),
        ("launch-kubeconfig-device", "KUBECONFIG", LAUNCH, TRAINER,
         {"env": (("KUBECONFIG", "/dev/zero"),)}),
    ]
]  # fmt: skip

# ------------------------------------------------ the local backend: what every node would refuse
LOCAL_REFUSALS = [
    refusal(f"local-{id}", field, LAUNCH, *LOCAL, *argv, cwd="{special}")
    for id, field, argv in [
        ("model-module-missing", "model", ("--model=kt_no_such_module:build",)),
        ("model-module-raises", "model", ("--model=kt_raising_model:build",)),
        ("model-module-syntax-error", "model", ("--model=kt_syntax_model:build",)),
        ("model-callable-missing", "model", ("--model=kt_good_model:no_such_callable",)),
        ("model-not-callable", "model", ("--model=kt_good_model:NOT_CALLABLE",)),
        ("data-manifest-not-json", "data", ("--data={special}/not-json",)),
        ("data-manifest-foreign", "data", ("--data={special}/foreign",)),
        ("data-folder-empty", "data", ("--data={special}/empty",)),
        ("checkpoint-dir-is-a-file", "checkpoint_dir", ("--checkpoint-dir={special}/a-file",)),
        ("checkpoint-dir-under-a-file", "checkpoint_dir",
         ("--checkpoint-dir={special}/a-file/ckpt",)),
    ]
]  # fmt: skip

REFUSALS = [
    *NAME_REFUSALS, *QUANTITY_REFUSALS, *IMAGE_REFUSALS, *TOLERATION_REFUSALS,
    *VOLUME_REFUSALS, *INT_REFUSALS, *LR_REFUSALS, *SUBMIT_REFUSALS, *READ_REFUSALS,
    *LOCAL_REFUSALS,
]  # fmt: skip


# --------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def special(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Inputs no user should give: a FIFO, a token over 1 MiB, folders that are no dataset, a
    file where a folder is expected, and model modules that fail to import."""
    root = tmp_path_factory.mktemp("special")
    os.mkfifo(root / "fifo")
    (root / "big").write_bytes(b"t" * (1024 * 1024 + 1))
    (root / "train.py").write_text("print('train')\n")
    (root / "not-json").mkdir()
    (root / "not-json" / "manifest.json").write_text("{not json")
    (root / "foreign").mkdir()
    (root / "foreign" / "manifest.json").write_text('{"format": "other/v1"}')
    (root / "empty").mkdir()
    (root / "a-file").write_text("not a folder\n")
    (root / "kt_raising_model.py").write_text("raise RuntimeError('no GPU here')\n")
    (root / "kt_syntax_model.py").write_text("def build(:\n")
    (root / "kt_good_model.py").write_text(
        "import torch\n\nNOT_CALLABLE = 1\n\n\ndef build(sample_shape, num_classes):\n"
        "    return torch.nn.Linear(1, num_classes)\n"
    )
    yield root


@pytest.fixture
def refused(
    k8s: Any,
    special: Path,
    digits_dir: Path,
    argo: ArgoServer,
    kfp_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> Callable[[Refusal], str]:
    """Run a refusal through ``kubetrain.cli.main`` and check the line and that nothing was
    created; returns the line."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    monkeypatch.setenv("KUBECONFIG", str(k8s.emulator.write_kubeconfig(tmp_path / "kubeconfig")))
    monkeypatch.setenv("KUBETRAIN_LOCAL_ROOT", str(workspace / "jobs"))
    for name in ARGO_ENV:
        monkeypatch.delenv(name, raising=False)
    # Importing a user's model module may cache its bytecode beside it; that is not output.
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    places = {"special": special, "digits": digits_dir, "argo": argo.url, "kfp": kfp_url}

    def run(case: Refusal) -> str:
        argv = [part.format_map(places) for part in case.argv]
        for name, value in case.env:
            monkeypatch.setenv(name, value.format_map(places))
        if case.cwd:
            monkeypatch.chdir(case.cwd.format_map(places))
        code, stderr = run_creating_nothing(argv, capsys, k8s, argo, workspace, digits_dir, special)
        assert code == 2, f"exit {code}: kubetrain {argv}\n{stderr}"
        line = assert_one_line_error(stderr, case.prog, case.field)
        assert line.startswith(f"{case.prog}: error: {case.field}: "), line
        return line

    return run


# -------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("case", REFUSALS)
def test_bad_value_is_one_line_naming_the_field_and_creates_nothing(
    case: Refusal, refused: Callable[[Refusal], str]
) -> None:
    refused(case)


def test_every_class_is_generated_for_every_field() -> None:
    """The catalogue covers each field with each class of its kind, and every case is new."""
    ids = [param.id for param in REFUSALS]
    assert len(ids) == len(set(ids))
    assert len(NAME_REFUSALS) == sum(len(BAD_NAMES[kind]) for _, _, _, kind, _, _ in NAME_FIELDS)
    assert len(REFUSALS) >= 300


def test_a_refused_value_is_quoted_escaped_and_short(refused: Callable[[Refusal], str]) -> None:
    """A newline shows as \\n (the line stays one line) and a huge value is cut."""
    line = refused(Refusal((*TRAINER, "--name=digits\n"), "name", LAUNCH))
    assert "'digits\\n'" in line
    line = refused(Refusal((*TRAINER, "--runtime=" + "x" * 5000), "runtime", LAUNCH))
    assert len(line) < 400


# ------------------------------------------------------------------------ accepted forms
def render(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = main(["render", "trainjob", "--name", "demo", *argv])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out


@pytest.mark.parametrize("value", GOOD_QUANTITIES)
def test_kubernetes_quantities_are_accepted(value: str, capsys: pytest.CaptureFixture[str]):
    out = render(capsys, f"--cpu={value}", f"--memory={value}")
    assert "cpu:" in out and "memory:" in out
    check_value("cpu", value, "--param cpu")
    check_value("memory", value, "--param memory")


def test_an_empty_quantity_means_unset_where_the_rule_refuses_it(capsys):
    """`--cpu ''` and `--param cpu=` leave the request to the runtime; as a quantity, '' is
    refused."""
    assert "cpu:" not in render(capsys, "--cpu=")
    check_value("cpu", "", "--param cpu")
    with pytest.raises(InvalidInput, match=r"^cpu: '' is not a Kubernetes quantity"):
        rules.quantity("", "cpu")


@pytest.mark.parametrize("value", GOOD_IMAGES)
def test_image_references_are_accepted(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert f"image: {value}" in render(capsys, f"--image={value}").replace("'", "")
    check_value("image", value, "--param image")


@pytest.mark.parametrize("text", GOOD_TOLERATIONS)
def test_tolerations_are_accepted(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert "tolerations:" in render(capsys, f"--toleration={text}")


def test_names_at_their_limits_are_accepted(capsys: pytest.CaptureFixture[str]) -> None:
    subdomain = ".".join(["a" * 63] * 3 + ["a" * 61])  # 253
    render(
        capsys,
        f"--runtime={subdomain}",
        f"--service-account={subdomain}",
        f"--volume={'v' * 63}={subdomain}:/mnt/v",
        f"--label={'k' * 63}={'V' * 63}",
        f"--label={'p' * 253}/{'k' * 63}=",
        f"--node-selector=example.com/{'K' * 63}=a.b_c-D",
        "--env=my.var-1=x",
    )
    for name in ("runtime", "service_account", "storage_secret", "shared_pvc"):
        check_value(name, subdomain, f"--param {name}")


def test_int32_limits_and_finite_rates_are_accepted(capsys: pytest.CaptureFixture[str]) -> None:
    render(capsys, f"--nodes={2**31 - 1}", f"--procs-per-node={2**31 - 1}", "--lr=1e-5")
    for name in ("nodes", "procs_per_node", "epochs", "batch_size", "gpu"):
        check_value(name, 2**31 - 1, f"--param {name}")
    for value in ("1e-5", "0.1", "3"):
        check_value("lr", value, "--param lr")


@pytest.mark.filterwarnings("ignore:The `json` method is deprecated")  # Hera 7.1's own call
def test_accepted_parameters_reach_the_argo_server(
    argo: ArgoServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same values, end to end: the workflow is created with them."""
    for name in ARGO_ENV:
        monkeypatch.delenv(name, raising=False)
    params = ["cpu=.5", "memory=100Mi", f"image=localhost:5000/t@{DIGEST}", "lr=1e-5",
              "nodes=4", "gpu=0", "runtime=torch.distributed", "storage_secret="]  # fmt: skip
    argv = ["submit", "argo", "--host", argo.url, "--generate-name", "digits-"]
    for param in params:
        argv += ["--param", param]
    before = len(argo.workflows)
    assert main(argv) == 0, capsys.readouterr().err
    assert len(argo.workflows) == before + 1


def test_a_good_model_dataset_and_checkpoint_folder_pass_the_local_checks(
    special: Path, digits_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kubetrain.components.launch_trainjob.launch import check_local_trainer

    monkeypatch.chdir(special)
    check_local_trainer(str(digits_dir), str(tmp_path / "new" / "ckpt"), "kt_good_model:build")
    check_local_trainer(str(digits_dir), str(tmp_path), "mlp")


def test_validation_patterns_are_applied_with_fullmatch() -> None:
    """``pattern.match`` with ``$`` accepts a trailing newline: no validator may use it."""
    sources = [
        REPO / "kubetrain" / "rules.py",
        REPO / "kubetrain" / "jobspec.py",
        REPO / "kubetrain" / "cli" / "submit_argo.py",
        REPO / "kubetrain" / "cli" / "submit.py",
        REPO / "kubetrain" / "cli" / "param_option.py",
        *(REPO / "kubetrain" / "render").glob("*.py"),
        *(REPO / "components" / "launch_trainjob").glob("*.py"),
    ]
    for source in sources:
        calls = re.findall(r"\.match\(|re\.search\(", source.read_text())
        assert calls == [], f"{source}: {calls}"
