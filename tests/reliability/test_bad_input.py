"""Bad input, through the CLI a user runs (issue 7, part 2).

Every case in ``BAD_INPUTS`` runs ``kubetrain.cli.main(argv)`` in-process against real
collaborators: the emulated Kubernetes API server (through a kubeconfig, as `kubectl` would be
pointed at a cluster), the emulated Argo Server, a recording KFP API and the local backend's job
folder. Each must exit non-zero with exactly ONE line on stderr, in the repo's error format
(``kubetrain CMD: error: PROBLEM; FIX``), naming the field or option and saying how to fix it,
and must create nothing: no object on the API server (and no write request to it), no request to
the KFP server, no workflow on the Argo Server, no file or job folder. The size of
``BAD_INPUTS`` is the figure the README quotes.
"""

from __future__ import annotations

import re
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kubetrain.cli import main
from tests.support.argo_server import ArgoServer


@dataclass(frozen=True)
class BadInput:
    """One bad input: ``argv`` after ``kubetrain`` ({placeholders} name prepared inputs, see
    ``places``), the ``field`` the error line must name, and the ``prog`` it must start with
    (default ``kubetrain <subcommand>``)."""

    id: str
    argv: tuple[str, ...]
    field: str
    prog: str = ""

    @property
    def expected_prog(self) -> str:
        return self.prog or f"kubetrain {self.argv[0]}"


def case(id: str, field: str, *argv: str, prog: str = "") -> Any:
    return pytest.param(BadInput(id, argv, field, prog), id=id)


# Launch on the emulated cluster (Kubeflow Trainer installed, runtime torch-distributed), or on
# the local backend with a real prepared dataset.
TRAINER = ("launch", "--backend", "trainer", "--data", "/mnt/shared/data")
LOCAL = ("launch", "--backend", "local", "--data", "{digits}")
ARGO = ("submit", "argo", "--host", "{argo}")
KFP = ("submit", "kfp", "--host", "{kfp}")
RUN = ("run", "--output", "{ws}/runs")
EVALUATE = ("evaluate", "--model", "{model}", "--data", "{digits}")
PROMOTE = ("promote", "--model", "{model}", "--registry", "{ws}/registry")

BAD_INPUTS: list[Any] = [
    # --- the command line itself
    case("unknown-subcommand", "COMMAND", "lauch", prog="kubetrain"),
    # --- kubetrain prep: dataset source, split, output
    case("prep-source-unknown-scheme", "source", "prep", "--source", "imagenet:train",
         "--output", "{ws}/data"),
    case("prep-source-unknown-sklearn-name", "source", "prep", "--source", "sklearn:mnist",
         "--output", "{ws}/data"),
    case("prep-source-unknown-torchvision-name", "source", "prep", "--source",
         "torchvision:ImageNet", "--output", "{ws}/data"),
    case("prep-source-missing-file", "source", "prep", "--source", "{ws}/nope.npz",
         "--output", "{ws}/data"),
    case("prep-source-split-file-missing", "source", "prep", "--source", "{inputs}/train-only",
         "--output", "{ws}/data"),
    case("prep-test-fraction-zero", "test_fraction", "prep", "--test-fraction", "0",
         "--output", "{ws}/data"),
    case("prep-test-fraction-above-one", "test_fraction", "prep", "--test-fraction", "1.5",
         "--output", "{ws}/data"),
    case("prep-test-fraction-not-a-number", "--test-fraction", "prep", "--test-fraction",
         "a-fifth", "--output", "{ws}/data"),
    case("prep-seed-negative", "seed", "prep", "--seed", "-1", "--output", "{ws}/data"),
    case("prep-output-missing", "--output", "prep"),
    case("prep-output-not-a-dataset-folder", "output_dir", "prep", "--output", "{inputs}/notes"),
    case("prep-output-unknown-protocol", "output_dir", "prep", "--output", "ftp2://bucket/data"),
    # --- kubetrain launch on the cluster: name, counts, strategy, resources, image, runtime...
    case("launch-name-not-rfc1035", "name", *TRAINER, "--name", "Digits_DDP"),
    case("launch-name-too-long", "name", *TRAINER, "--name", "a" * 64),
    case("launch-nodes-zero", "nodes", *TRAINER, "--nodes", "0"),
    case("launch-nodes-negative", "nodes", *TRAINER, "--nodes", "-2"),
    case("launch-nodes-not-a-number", "nodes", *TRAINER, "--nodes", "two"),
    case("launch-procs-per-node-zero", "procs_per_node", *TRAINER, "--procs-per-node", "0"),
    case("launch-strategy-unknown", "strategy", *TRAINER, "--strategy", "zero3"),
    case("launch-model-unknown", "model", *TRAINER, "--model", "resnet"),
    case("launch-cpu-malformed", "resources_per_node.cpu", *TRAINER, "--cpu", "2 cores"),
    case("launch-memory-malformed", "resources_per_node.memory", *TRAINER, "--memory", "4GB"),
    case("launch-gpu-negative", "resources_per_node.gpu", *TRAINER, "--gpu", "-1"),
    case("launch-gpu-not-a-number", "--gpu", *TRAINER, "--gpu", "one"),
    case("launch-image-with-spaces", "image", *TRAINER, "--image", "ghcr.io/org/trainer 1.0"),
    case("launch-runtime-not-on-cluster", "runtime", *TRAINER, "--runtime", "torch-tpu"),
    case("launch-runtime-kind-unknown", "runtime.kind", *TRAINER, "--runtime-kind", "Runtime"),
    case("launch-script-over-configmap-limit", "script", *TRAINER, "--script", "{inputs}/big.py",
         "--", "torchrun", "big.py"),
    case("launch-script-missing", "script", *TRAINER, "--script", "{ws}/train.py",
         "--", "torchrun", "train.py"),
    case("launch-env-reserved-pet", "env", *TRAINER, "--env", "PET_NNODES=4"),
    case("launch-env-not-key-value", "--env", *TRAINER, "--env", "DEBUG"),
    case("launch-label-key-invalid", "labels", *TRAINER, "--label", "my team=ml"),
    case("launch-pod-label-value-invalid", "pod_labels", *TRAINER, "--pod-label", "team=-ml-"),
    case("launch-storage-secret-invalid", "storage_secret", *TRAINER,
         "--storage-secret", "S3_Creds"),
    case("launch-checkpoint-url-unknown-protocol", "checkpoint_dir", *TRAINER,
         "--checkpoint-dir", "ftp2://bucket/ckpt"),
    case("launch-data-url-unknown-protocol", "data", "launch", "--backend", "trainer",
         "--data", "ftp2://bucket/data"),
    case("launch-volume-malformed", "--volume", *TRAINER, "--volume", "my-pvc"),
    case("launch-namespace-invalid", "namespace", *TRAINER, "--namespace", "Team_A"),
    case("launch-trainer-version-unknown", "trainer_version", *TRAINER,
         "--trainer-version", "3.0"),
    case("launch-deadline-zero", "active_deadline_seconds", *TRAINER,
         "--active-deadline-seconds", "0"),
    case("launch-max-restarts-negative", "max_restarts", *TRAINER, "--max-restarts", "-1"),
    case("launch-max-restarts-beyond-runtime", "max_restarts", *TRAINER, "--max-restarts", "3"),
    case("launch-dataset-uri-not-a-uri", "dataset_initializer.storage_uri", *TRAINER,
         "--dataset-uri", "my-dataset"),
    case("launch-backend-unknown", "backend", "launch", "--backend", "k8s", "--data", "/d"),
    case("launch-job-backend-hostname-too-long", "name", "launch", "--backend", "job",
         "--name", "a" * 62, "--data", "/mnt/shared/data"),
    # --- kubetrain launch on this machine (no job folder may appear)
    case("launch-local-data-not-a-dataset", "--data", "launch", "--backend", "local",
         "--data", "{inputs}/notes"),
    case("launch-local-epochs-zero", "epochs", *LOCAL, "--epochs", "0"),
    case("launch-local-keep-checkpoints-negative", "keep_checkpoints", *LOCAL,
         "--keep-checkpoints", "-1"),
    case("launch-local-lr-zero", "lr", *LOCAL, "--lr", "0"),
    case("launch-local-command-not-found", "command", "launch", "--backend", "local",
         "--nodes", "1", "--", "no-such-program-kubetrain"),
    # --- kubetrain render (creates nothing by design; the same checks as launch)
    case("render-nodes-zero", "nodes", "render", "trainjob", "--nodes", "0"),
    # --- kubetrain wait / logs / delete
    case("wait-no-such-job", "name", "wait", "no-such-job", "--backend", "trainer"),
    case("wait-timeout-negative", "timeout", "wait", "some-job", "--backend", "trainer",
         "--timeout", "-5"),
    case("wait-timeout-nan", "timeout", "wait", "some-job", "--backend", "trainer",
         "--timeout", "nan"),
    case("wait-timeout-not-a-number", "--timeout", "wait", "some-job", "--timeout", "soon"),
    case("wait-job-name-empty", "job_name", "wait", "", "--backend", "trainer"),
    case("wait-stall-timeout-negative", "stall_timeout", "wait", "some-job", "--backend",
         "trainer", "--stall-timeout", "-1"),
    case("wait-on-cancel-unknown", "on_cancel", "wait", "some-job", "--backend", "trainer",
         "--on-cancel", "orphan"),
    case("logs-node-not-a-number", "--node", "logs", "some-job", "--node", "first"),
    case("delete-no-such-job", "--ignore-not-found", "delete", "no-such-job",
         "--backend", "trainer"),
    case("delete-name-and-run-name", "name", "delete", "some-job", "--run-name", "run-1",
         "--backend", "trainer"),
    # --- kubetrain collect
    case("collect-empty-checkpoint-folder", "checkpoint_dir", "collect", "--checkpoint-dir",
         "{inputs}/empty-ckpt", "--output", "{ws}/model"),
    case("collect-missing-checkpoint-folder", "checkpoint_dir", "collect", "--checkpoint-dir",
         "{ws}/no-ckpt", "--output", "{ws}/model"),
    case("collect-export-unknown", "--export", "collect", "--checkpoint-dir", "{ckpt}",
         "--output", "{ws}/model", "--export", "onnx"),
    case("collect-output-unknown-protocol", "output", "collect", "--checkpoint-dir", "{ckpt}",
         "--output", "ftp2://bucket/model"),
    # --- kubetrain evaluate
    case("evaluate-threshold-above-one", "threshold", *EVALUATE, "--threshold", "95"),
    case("evaluate-threshold-negative", "threshold", *EVALUATE, "--threshold", "-0.1"),
    case("evaluate-threshold-nan", "threshold", *EVALUATE, "--threshold", "nan"),
    case("evaluate-missing-model", "model", "evaluate", "--model", "{ws}/no-model",
         "--data", "{digits}"),
    case("evaluate-model-tampered", "model", "evaluate", "--model", "{inputs}/model-tampered",
         "--data", "{digits}"),
    case("evaluate-data-not-a-dataset", "--data", "evaluate", "--model", "{model}",
         "--data", "{inputs}/notes"),
    case("evaluate-data-wrong-sha256", "dataset", "evaluate", "--model", "{model}",
         "--data", "{inputs}/digits-corrupt", "--threshold", "0"),
    case("evaluate-data-file-missing", "dataset", "evaluate", "--model", "{model}",
         "--data", "{inputs}/digits-no-test", "--threshold", "0"),
    # --- kubetrain promote
    case("promote-version-not-a-segment", "version", *PROMOTE, "--version", "../v1"),
    case("promote-version-is-the-pointer", "version", *PROMOTE, "--version", "promoted"),
    case("promote-accuracy-above-one", "accuracy", *PROMOTE, "--version", "v1",
         "--accuracy", "97"),
    case("promote-registry-unreachable", "registry", "promote", "--model", "{model}",
         "--registry", "s3://bucket/registry", "--version", "v1"),
    case("promote-missing-model", "model", "promote", "--model", "{ws}/no-model",
         "--registry", "{ws}/registry", "--version", "v1"),
    # --- kubetrain run (the whole pipeline here: nothing may start)
    case("run-nodes-zero", "--nodes", *RUN, "--nodes", "0"),
    case("run-epochs-zero", "--epochs", *RUN, "--epochs", "0"),
    case("run-model-unknown", "--model", *RUN, "--model", "resnet"),
    case("run-strategy-unknown", "--strategy", *RUN, "--strategy", "zero3"),
    case("run-dataset-unknown", "--dataset", *RUN, "--dataset", "sklearn:mnist"),
    case("run-threshold-above-one", "threshold", *RUN, "--threshold", "95"),
    case("run-storage-unknown-protocol", "--storage", *RUN, "--storage", "ftp2://bucket/runs"),
    # --- kubetrain submit kfp (parameters checked before the server is contacted)
    case("submit-kfp-host-missing", "--host", "submit", "kfp", prog="kubetrain submit kfp"),
    case("submit-kfp-param-unknown", "--param", *KFP, "--param", "gpus=2", prog="kubetrain submit"),
    case("submit-kfp-param-not-name-value", "--param", *KFP, "--param", "nodes",
         prog="kubetrain submit"),
    case("submit-kfp-param-wrong-type", "--param nodes", *KFP, "--param", "nodes=two",
         prog="kubetrain submit"),
    case("submit-kfp-param-nodes-zero", "--param nodes", *KFP, "--param", "nodes=0",
         prog="kubetrain submit"),
    case("submit-kfp-param-threshold-above-one", "--param accuracy_threshold", *KFP,
         "--param", "accuracy_threshold=95", prog="kubetrain submit"),
    case("submit-kfp-package-missing", "--package", *KFP, "--package", "{ws}/pipeline.yaml",
         prog="kubetrain submit"),
    # --- kubetrain submit argo (the same, against the Argo Server)
    case("submit-argo-host-missing", "--host", "submit", "argo", prog="kubetrain submit"),
    case("submit-argo-host-not-http", "--host", "submit", "argo", "--host", "ftp://argo:2746",
         prog="kubetrain submit"),
    case("submit-argo-param-unknown", "--param", *ARGO, "--param", "gpus=2",
         prog="kubetrain submit"),
    case("submit-argo-param-strategy-unknown", "--param strategy", *ARGO,
         "--param", "strategy=zero3", prog="kubetrain submit"),
    case("submit-argo-param-procs-zero", "--param procs_per_node", *ARGO,
         "--param", "procs_per_node=0", prog="kubetrain submit"),
    case("submit-argo-generate-name-invalid", "--generate-name", *ARGO,
         "--generate-name", "Digits_", prog="kubetrain submit"),
    case("submit-argo-namespace-invalid", "--namespace", *ARGO, "--namespace", "Team_A",
         prog="kubetrain submit"),
    case("submit-argo-package-not-yaml", "--package", *ARGO, "--package", "{inputs}/bad.yaml",
         prog="kubetrain submit"),
]  # fmt: skip

#: The verbs of a fix (what to do about it); a fix must use one.
FIX_WORDS = (
    "use", "give", "pass", "set", "write", "choose", "check", "point", "run", "see", "add",
    "put", "bake", "collect", "re-collect", "re-create",
)  # fmt: skip
ERROR_LINE = re.compile(r"^(?P<prog>kubetrain(?: [a-z]+)*): error: (?P<problem>.+?); (?P<fix>.+)$")
# Writes that leave an object behind or changed; a delete is how `kubetrain delete` learns a
# job is missing, and the unchanged object set shows that it removed nothing.
WRITE_VERBS = {"create", "update", "patch"}
ARGO_ENV = (
    "ARGO_SERVER", "ARGO_TOKEN", "ARGO_NAMESPACE", "ARGO_BASE_HREF", "ARGO_SECURE",
    "ARGO_INSECURE_SKIP_VERIFY",
)  # fmt: skip


def assert_one_line_error(stderr: str, prog: str, field: str) -> str:
    """The repo's error format: one line ``PROG: error: PROBLEM; FIX`` that names ``field`` and
    whose fix says what to do. Returns the line."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line, got {len(lines)}:\n{stderr}"
    (line,) = lines
    match = ERROR_LINE.match(line)
    assert match, f"not 'kubetrain CMD: error: PROBLEM; FIX': {line}"
    assert match["prog"] == prog, line
    assert re.search(rf"(?<![\w-]){re.escape(field)}(?![\w-])", line), f"no {field!r}: {line}"
    words = set(re.findall(r"[a-z][a-z-]*", match["fix"].lower()))
    assert words & set(FIX_WORDS), f"the fix says nothing to do: {match['fix']!r}"
    return line


def tree(*roots: Path) -> dict[str, tuple[bool, int, int]]:
    """Every file and folder under ``roots``: (is a folder, size, mtime), to see any change."""
    found = {}
    for root in roots:
        for path in [root, *root.rglob("*")] if root.exists() else []:
            stat = path.stat()
            found[str(path)] = (path.is_dir(), stat.st_size, stat.st_mtime_ns)
    return found


# ------------------------------------------------------------------------ prepared inputs
def _collected_model(root: Path) -> tuple[Path, Path]:
    """A checkpoint and the model collected from it, of an untrained mlp on digits' shape."""
    import torch

    from kubetrain.artifacts.checkpoint import save_checkpoint
    from kubetrain.artifacts.models import build_model
    from kubetrain.components.collect_checkpoint.collect import collect_checkpoint

    torch.manual_seed(0)
    model = build_model("mlp", [1, 8, 8], 10)
    save_checkpoint(
        root / "ckpt",
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        epoch=1,
        step=1,
        strategy="ddp",
        model_info={"spec": "mlp", "sample_shape": [1, 8, 8], "num_classes": 10},
        metrics=[],
    )
    collect_checkpoint(str(root / "ckpt"), str(root / "model"))
    return root / "ckpt", root / "model"


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory, digits_dir: Path) -> Path:
    """Read-only inputs of the cases: a model and its checkpoint, damaged copies of a dataset
    and a model, an empty checkpoint folder, a script over a ConfigMap's 1 MiB..."""
    root = tmp_path_factory.mktemp("bad-input")
    _collected_model(root)
    shutil.copytree(root / "model", root / "model-tampered")
    _flip_last_byte(root / "model-tampered" / "model.safetensors")
    shutil.copytree(digits_dir, root / "digits-corrupt")
    _flip_last_byte(root / "digits-corrupt" / "test.safetensors")
    shutil.copytree(digits_dir, root / "digits-no-test")
    (root / "digits-no-test" / "test.safetensors").unlink()
    (root / "empty-ckpt").mkdir()
    (root / "notes").mkdir()
    (root / "notes" / "README.txt").write_text("not a dataset\n")
    (root / "big.py").write_bytes(b"#" * (1024 * 1024 + 1))
    (root / "train-only").mkdir()
    np.savez(root / "train-only" / "train.npz", x=np.zeros((4, 2)), y=np.array([0, 1, 0, 1]))
    (root / "bad.yaml").write_text("kind: Workflow\nspec: {templates: [\n")
    return root


class RecordingKfpApi(BaseHTTPRequestHandler):
    """A KFP API endpoint that answers nothing useful and records every request."""

    received: list[tuple[str, str]] = []

    def _record(self) -> None:
        self.received.append((self.command, self.path))
        self.send_response(500)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = _record

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def kfp_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), RecordingKfpApi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join(10)


@pytest.fixture(scope="module")
def argo() -> Iterator[ArgoServer]:
    with ArgoServer() as server:
        yield server


# --------------------------------------------------------------------------------- tests
def test_the_catalogue_covers_every_step() -> None:
    """At least 34 distinct cases (the issue asks for 30), across every command a user runs."""
    cases = [param.values[0] for param in BAD_INPUTS]
    assert len(cases) >= 34
    assert len({c.id for c in cases}) == len({c.argv for c in cases}) == len(cases)
    commands = {c.argv[0] if c.argv[0] != "submit" else " ".join(c.argv[:2]) for c in cases}
    assert {"prep", "launch", "wait", "collect", "evaluate", "promote", "run"} <= commands
    assert {"submit kfp", "submit argo", "delete"} <= commands


@pytest.mark.bad_input
@pytest.mark.parametrize("bad", BAD_INPUTS)
def test_bad_input_is_one_line_naming_the_field_and_creates_nothing(
    bad: BadInput,
    k8s: Any,
    inputs: Path,
    digits_dir: Path,
    argo: ArgoServer,
    kfp_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    monkeypatch.setenv("KUBECONFIG", str(k8s.emulator.write_kubeconfig(tmp_path / "kubeconfig")))
    monkeypatch.setenv("KUBETRAIN_LOCAL_ROOT", str(workspace / "jobs"))
    for name in ARGO_ENV:
        monkeypatch.delenv(name, raising=False)
    places = {
        "ws": workspace,
        "inputs": inputs,
        "digits": digits_dir,
        "model": inputs / "model",
        "ckpt": inputs / "ckpt",
        "argo": argo.url,
        "kfp": kfp_url,
    }
    argv = [part.format_map(places) for part in bad.argv]

    code, stderr = run_creating_nothing(argv, capsys, k8s, argo, workspace, inputs, digits_dir)

    assert code not in (0, None), f"accepted: kubetrain {' '.join(argv)}"
    assert_one_line_error(stderr, bad.expected_prog, bad.field)


def run_creating_nothing(
    argv: list[str],
    capsys: pytest.CaptureFixture[str],
    k8s: Any,
    argo: ArgoServer,
    workspace: Path,
    *read_only: Path,
) -> tuple[int | str | None, str]:
    """``kubetrain.cli.main(argv)`` in-process: (exit code, stderr), once checked that it
    created nothing: no object and no write request on the emulated API server, no request to
    the Argo or KFP server, no change under ``workspace`` or ``read_only``, no local job."""
    files_before = tree(workspace, *read_only)
    objects_before = k8s.emulator.object_keys()
    argo_before = (len(argo.requests), dict(argo.workflows), dict(argo.templates))
    kfp_before = len(RecordingKfpApi.received)
    started = time.monotonic()
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    stderr = capsys.readouterr().err
    assert k8s.emulator.object_keys() == objects_before
    writes = [r for r in k8s.emulator.requests(since=started) if r.verb in WRITE_VERBS]
    assert writes == [], writes
    assert (len(argo.requests), dict(argo.workflows), dict(argo.templates)) == argo_before
    assert len(RecordingKfpApi.received) == kfp_before
    assert tree(workspace, *read_only) == files_before
    assert not (workspace / "jobs").exists(), "a local job folder was created"
    return code, stderr


def test_parameter_rules_agree_with_the_steps() -> None:
    """`submit` and `run` check parameter values with rules of their own (kept light for
    `kubetrain --help`); they must accept the steps' choices and nothing else."""
    from kubetrain.backends import BACKENDS, CANCEL_ACTIONS
    from kubetrain.cli.param_option import VALUE_RULES
    from kubetrain.components.collect_checkpoint.collect import EXPORT_KINDS
    from kubetrain.components.launch_trainjob import launch
    from kubetrain.rules import BUILTIN_MODELS

    for name, choices in (
        ("strategy", launch.STRATEGIES),
        ("backend", BACKENDS),
        ("on_cancel", CANCEL_ACTIONS),
        ("export", EXPORT_KINDS),
        ("model", BUILTIN_MODELS),
    ):
        rule = VALUE_RULES[name]
        assert all(rule.accepts(choice) for choice in choices), name
        assert not rule.accepts("no-such-choice"), name
    for name, rule in VALUE_RULES.items():
        assert rule.accepts(rule.example), name
