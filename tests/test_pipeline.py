"""The pipeline and components compile to valid, current KFP YAML, and `kubetrain run` works."""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from google.protobuf import json_format
from kfp.components import load_component_from_file
from kfp.pipeline_spec import pipeline_spec_pb2

from kubetrain.cli import build_parser, main
from kubetrain.cli.compile import ARGO_WORKFLOWS, COMPONENTS, PIPELINES
from kubetrain.cli.run import check_local_runner
from kubetrain.errors import KubetrainError
from kubetrain.names import derive_job_name
from kubetrain.render.pod import STORAGE_ENV_KEYS

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def fresh_compile(tmp_path_factory) -> Path:
    """`kubetrain compile` with no --output-dir, run in an empty folder: what it writes."""
    workdir = tmp_path_factory.mktemp("cwd")
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(printed):
        patch.chdir(workdir)
        assert main(["compile"]) == 0
    out = workdir / "compiled"
    written = [Path(line.removeprefix("wrote ")) for line in printed.getvalue().splitlines()[:-1]]
    assert written and all(path.is_relative_to(out) and path.is_file() for path in written)
    assert printed.getvalue().splitlines()[-1] == f"compiled {len(written)} files under {out}"
    return out


@pytest.mark.security
def test_a_storage_secret_is_chosen_when_compiling_and_given_by_reference(tmp_path):
    """Issue 17 (10): `kubetrain compile --storage-secret NAME` gives prep, collect and evaluate
    the Secret's keys by reference (a constant name, never a run parameter that could render
    ``secretKeyRef.name: ""``) and the TrainJob the same Secret through launch."""
    assert main(["compile", "--output-dir", str(tmp_path), "--storage-secret", "team-s3"]) == 0
    documents = list(
        yaml.safe_load_all((tmp_path / "pipelines/compiled/training_pipeline.yaml").read_text())
    )
    platform = documents[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    for step in ("dataset-prep", "collect-checkpoint", "evaluate-model"):
        (secret,) = platform[f"exec-{step}"]["secretAsEnv"]
        assert secret["secretName"] == "team-s3" and secret["optional"] is True
        assert [k["envVar"] for k in secret["keyToEnv"]] == list(STORAGE_ENV_KEYS)
    launch = dag_tasks(json_format.ParseDict(documents[0], pipeline_spec_pb2.PipelineSpec()))[
        "launch-trainjob"
    ]
    assert launch.inputs.parameters["storage_secret"].runtime_value.constant.string_value == (
        "team-s3"
    )


@pytest.mark.bad_input
def test_a_bad_storage_secret_is_refused_when_compiling(tmp_path, capsys):
    assert main(["compile", "--output-dir", str(tmp_path), "--storage-secret", "Team_S3"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "--storage-secret" in line and "e.g. s3-creds" in line
    assert not any(tmp_path.iterdir())


def test_compile_writes_under_the_current_folder_not_the_package(fresh_compile):
    """Issue 17 (19): installed from a wheel, the package folder is site-packages; `kubetrain
    compile` with no --output-dir writes ./compiled (the fixture above) and says so."""
    components = sorted(
        f"{p.parent.name}/{p.name}" for p in fresh_compile.glob("components/*/*.yaml")
    )
    assert components == sorted(f"{step}/{filename}" for step, _, filename in COMPONENTS)
    pipelines = sorted(p.stem for p in fresh_compile.glob("pipelines/compiled/*.yaml"))
    assert pipelines == sorted([*PIPELINES, *ARGO_WORKFLOWS])
    assert build_parser().parse_args(["compile"]).output_dir == Path("compiled")


#: The pipeline's container steps: the body (in its exit handler), the gate and promote (in
#: the gate's condition) and the exit handler's delete.
STEPS = {
    "dataset-prep",
    "launch-trainjob",
    "wait-trainjob",
    "collect-checkpoint",
    "evaluate-model",
    "promotion-gate",
    "promote-model",
    "delete-trainjob",
}


def dag_tasks(
    spec: pipeline_spec_pb2.PipelineSpec,
) -> dict[str, pipeline_spec_pb2.PipelineTaskSpec]:
    """Every task of the pipeline, in the root DAG or a nested one (exit handler, condition)."""
    dags = [spec.root.dag, *(c.dag for c in spec.components.values() if c.HasField("dag"))]
    return {name: task for dag in dags for name, task in dag.tasks.items()}


def test_compiled_pipeline_parses_into_pipeline_spec(fresh_compile):
    documents = list(
        yaml.safe_load_all(
            (fresh_compile / "pipelines/compiled/training_pipeline.yaml").read_text()
        )
    )
    spec = json_format.ParseDict(documents[0], pipeline_spec_pb2.PipelineSpec())
    assert spec.pipeline_info.name == "kubetrain-training"
    tasks = dag_tasks(spec)
    assert STEPS <= set(tasks)
    assert {name.removeprefix("exec-") for name in spec.deployment_spec["executors"]} == STEPS
    assert "wait-trainjob" in tasks["collect-checkpoint"].dependent_tasks
    for name in (
        "nodes",
        "procs_per_node",
        "strategy",
        "epochs",
        "lr",
        "batch_size",
        "image",
        "runtime",
        "accuracy_threshold",
        "dataset_source",
        "model_registry",
    ):
        assert name in spec.root.input_definitions.parameters
    # the default compile names no storage Secret: no step gets a secretKeyRef (issue 17 (10))
    platform = documents[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert not [step for step, config in platform.items() if "secretAsEnv" in config]
    assert "storage_secret" not in spec.root.input_definitions.parameters
    for step in STEPS:
        context = platform[f"exec-{step}"]["securityContext"]
        assert context == {"runAsUser": "10001", "runAsGroup": "10001", "runAsNonRoot": True}
    # no step reinstalls kfp at run time
    for executor in spec.deployment_spec["executors"].values():
        assert "pip install" not in " ".join(executor["container"]["command"])


def test_committed_yaml_is_not_stale(fresh_compile):
    pairs = [
        (
            fresh_compile / "pipelines/compiled" / f"{stem}.yaml",
            REPO / "pipelines/compiled" / f"{stem}.yaml",
        )
        for stem in [*PIPELINES, *ARGO_WORKFLOWS]
    ]
    pairs += [
        (
            fresh_compile / "components" / step / filename,
            REPO / "components" / step / filename,
        )
        for step, _, filename in COMPONENTS
    ]
    stale = [
        str(committed.relative_to(REPO))
        for fresh, committed in pairs
        if not committed.is_file() or _content(committed) != _content(fresh)
    ]
    assert stale == [], f"run `make compile` and commit: {stale}"


def _content(compiled: Path) -> str:
    """A compiled file less the stamp of the kfp release that wrote it (`sdkVersion:`): a
    patch release of kfp (2.17.0 or 2.17.3, whichever pip resolves) changes nothing else."""
    return "".join(
        line for line in compiled.read_text().splitlines(True) if not line.startswith("sdkVersion:")
    )


@pytest.mark.parametrize(("step", "function", "filename"), COMPONENTS)
def test_component_yaml_loads_back(step, function, filename):
    component = load_component_from_file(str(REPO / "components" / step / filename))
    assert component.name == function.replace("_", "-")


def run_pipeline(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kubetrain", "run", "--output", str(tmp_path / "runs"), *args],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=tmp_path,
    )


def summary_accuracy(stdout: str) -> float:
    match = re.search(r"^accuracy (\d\.\d{3}) ", stdout, re.MULTILINE)
    assert match, stdout[-3000:]
    return float(match.group(1))


def test_kubetrain_run_trains_two_nodes_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBETRAIN_LOCAL_ROOT", str(tmp_path / "jobs"))
    # --keep-job: the job's folder is looked at below (by default a passing run removes it,
    # tests/test_run_housekeeping.py)
    result = run_pipeline(tmp_path, "--keep-job")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert summary_accuracy(result.stdout) >= 0.95
    model_dir = Path(re.search(r"^model\s+(\S+)", result.stdout, re.MULTILINE).group(1))
    assert (model_dir / "model.safetensors").is_file()
    # every path the summary names exists (metrics named an artifact the runner never wrote)
    metrics = Path(re.search(r"^metrics\s+(\S+)", result.stdout, re.MULTILINE).group(1))
    figures = json.loads(metrics.read_text())
    assert round(figures["accuracy"], 3) == summary_accuracy(result.stdout)
    assert set(figures) == {"accuracy", "loss", "test_samples"}
    # the training really ran as two nodes, each a torchrun of its own
    (job,) = (tmp_path / "jobs").iterdir()
    assert sorted(p.name for p in job.glob("node-*.log")) == ["node-0.log", "node-1.log"]
    # Issue 17 (20): a passing model is promoted, behind the single-output gate, as version
    # <run>: the run's resource name (issue 17 (7)), which names its job too; `kubetrain run`
    # resolves it to the local runner's <pipeline>-<timestamp>.
    promoted = Path(re.search(r"^promoted (\S+)", result.stdout, re.MULTILINE).group(1))
    run_name = promoted.name
    assert re.fullmatch(r"kubetrain-training(-\d+){7}", run_name), run_name
    assert promoted == tmp_path / "runs" / "registry" / run_name
    assert (promoted / "model.safetensors").is_file()
    assert json.loads((promoted.parent / "PROMOTED").read_text())["version"] == run_name
    assert job.name == derive_job_name(run_name)
    # the exit handler ran and kept the completed job (issue 27 (1): the job decides)
    kept = f"KFP reports the run's body SUCCEEDED: job {job.name} completed, kept with its status"
    assert kept in result.stdout
    # Issue 18 (1): concise by default, no colour when not on a terminal: a line per step as
    # it starts and ends, rank 0's epoch lines, the summary last; no KFP executor dumps.
    lines = result.stdout.splitlines()
    assert len(lines) < 40, result.stdout
    assert "\x1b[" not in result.stdout + result.stderr
    assert "executor_input" not in result.stdout and "Executing task" not in result.stdout
    assert "dataset-prep started" in lines and "wait-trainjob started" in lines
    assert re.search(r"^wait-trainjob done in \d+\.\ds$", result.stdout, re.MULTILINE)
    assert sum(line.startswith("  epoch ") for line in lines) == 10
    summary = lines.index(next(line for line in lines if line.startswith("kubetrain run: ")))
    assert lines[summary - 1] == "" and lines[summary].startswith("kubetrain run: 2 node(s)")
    assert lines[-1].startswith("promoted ")
    # rank 0's TensorBoard events (the tensorboard package is a dev dependency) outlive the
    # job folder the run removed: they were moved into the run's folder
    events = Path(re.search(r"^events\s+(\S+)", result.stdout, re.MULTILINE).group(1))
    assert events == promoted.parents[1] / run_name / "tensorboard"
    assert list(events.glob("events.out.tfevents.*"))


def test_kubetrain_run_below_threshold_exits_3(tmp_path, monkeypatch):
    """With --verbose (issue 18 (1)): KFP's local-runner logging and executor dumps too, their
    colour stripped when not on a terminal (kfp 2.17 kfp/local/logging_utils.py colours)."""
    monkeypatch.setenv("KUBETRAIN_LOCAL_ROOT", str(tmp_path / "jobs"))
    result = run_pipeline(
        tmp_path, "--epochs", "1", "--threshold", "0.999", "--strategy", "fsdp", "--verbose"
    )
    assert result.returncode == 3, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Got executor_input:" in result.stdout
    assert "Executing task 'wait-trainjob'" in result.stdout
    assert "checkpoint saved: " in result.stdout
    assert "\x1b[" not in result.stdout + result.stderr
    assert result.stdout.splitlines()[-1].startswith("promoted no ")
    assert "below threshold" in result.stdout
    # the gate said no, so promote did not run (issue 17 (20))
    assert "not promoting: the model did not pass the evaluation" in result.stdout
    assert re.search(r"^promoted no ", result.stdout, re.MULTILINE)
    assert not (tmp_path / "runs" / "registry").exists()


def test_kubetrain_run_failing_wait_deletes_the_job_in_the_exit_handler(tmp_path, monkeypatch):
    """Issue 17 (5): the pipeline's dsl.ExitHandler deletes the job of a failed run whose job
    still runs (on a cluster, a stopped one's too: wait's on_cancel gets SIGTERM but may be
    killed before it finishes, pipelines/training_pipeline.py); KFP's local runner runs it
    (kfp 2.17 kfp/local/orchestrator/enhanced_dag_orchestrator.py)."""
    monkeypatch.setenv("KUBETRAIN_LOCAL_ROOT", str(tmp_path / "jobs"))
    result = run_pipeline(tmp_path, "--timeout", "1")
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    # Issue 18 (2): the run ends with the failing step, its cause and how to see more, no colour
    last_line = result.stderr.splitlines()[-1]
    assert last_line.startswith(
        "kubetrain run: error: step wait-trainjob failed: timed out after 1s waiting for job "
    ), last_line
    assert "\x1b[" not in result.stdout + result.stderr
    assert re.search(r"^wait-trainjob failed after \d+\.\ds: timed out", result.stdout, re.M)
    deleted = re.search(r"body FAILED: stopped (\S+); its folder stays", result.stdout)
    assert deleted, result.stdout[-3000:]
    # Issue 18 (3): under `kubetrain run` the exit handler stops the job and keeps its folder,
    # whose logs the run's last line points to
    (job_dir,) = (tmp_path / "jobs").iterdir()
    assert job_dir.name == deleted.group(1)
    assert last_line.endswith(f"; to see more: kubetrain logs {job_dir.name}")


@pytest.mark.parametrize(
    ("kfp", "refused"), [("2.16.1", True), ("2.17.0", False), ("3.0.0", False)]
)
def test_kubetrain_run_needs_a_local_runner_that_runs_exit_handlers(kfp, refused):
    """The pipeline's dsl.ExitHandler runs under kfp 2.17's local runner, not 2.14-2.16's
    (kfp 2.17 kfp/local/pipeline_orchestrator.py has_exit_handler), which pyproject allows."""
    if refused:
        with pytest.raises(KubetrainError, match=r"kfp 2\.16\.1's local runner.*kfp>=2\.17"):
            check_local_runner(kfp)
    else:
        check_local_runner(kfp)


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("registry", "message"),
    [("nosuch://bucket/registry", "nosuch"), ("", "is empty")],
)
def test_kubetrain_run_refuses_a_registry_promote_cannot_publish_to(tmp_path, registry, message):
    """Refused before any step runs, not when promote runs after the training."""
    result = run_pipeline(tmp_path, "--registry", registry)
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith("kubetrain run: error: --registry: ") and message in line
    assert not (tmp_path / "runs").exists()
