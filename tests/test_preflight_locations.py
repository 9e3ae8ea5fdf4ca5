"""Pre-flight before any work (issue 28, "Bad input accepted, or refused after the work"):
every step checks ``--output-parameters`` before it creates or writes anything; `kubetrain
run` checks the program it starts and every folder it writes before prep writes; `evaluate --
CMD` refuses a --model (or --data) that is no collected model before the program runs; `submit
kfp|argo` applies the launch and prep steps' rules to the values it sends before contacting the
server, and a KFP server that fails its health check is one line, not five tracebacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kubetrain.components._shared.step_outputs import OPTION, check_output_parameters
from kubetrain.errors import InvalidInput
from tests.support.argo_server import ArgoServer
from tests.support.processes import kubetrain_in_process as run_cli
from tests.test_submit_kfp import FakeKfpApi, kfp_api  # noqa: F401 (a fixture)

# Hera 7.1's service serializes requests with pydantic's deprecated ``.json()``.
pytestmark = pytest.mark.filterwarnings("ignore:The `json` method is deprecated")


def one_line(err: str, prog: str, *needles: str) -> str:
    """The single error line ``PROG: error: ...`` naming each needle."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line, got:\n{err}"
    assert lines[0].startswith(f"kubetrain {prog}: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]}"
    return lines[0]


@pytest.fixture
def a_file(tmp_path) -> Path:
    path = tmp_path / "a-file"
    path.write_text("not a folder\n")
    return path


# ----------------------------------------------------------------- the --output-parameters rule
@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("where", "names", "problem"),
    [
        ("{file}/outputs", (), "a-file is a file, not a folder, so "),
        ("{file}", (), "a-file is a file, not a folder; "),
        ("{link}", (), "is a broken symbolic link"),
        ("s3://bucket/outputs", (), "is a URL, and the outputs are files of this step's own"),
        ("{tmp}/out\0puts", (), "holds a NUL byte"),
        ("{tmp}/taken", ("accuracy", "passed"), "taken/passed is a folder, where the output "),
    ],
    ids=["under-a-file", "a-file", "broken-link", "url", "nul", "an-output-is-a-folder"],
)
def test_an_unusable_output_parameters_folder_is_refused(tmp_path, a_file, where, names, problem):
    (tmp_path / "link").symlink_to(tmp_path / "missing")
    (tmp_path / "taken" / "passed").mkdir(parents=True)
    folder = where.format(file=a_file, link=tmp_path / "link", tmp=tmp_path)
    with pytest.raises(InvalidInput, match=f"^{OPTION}: ") as refused:
        check_output_parameters(folder, names)
    assert problem in str(refused.value)


def test_a_usable_output_parameters_folder_passes_and_nothing_is_made(tmp_path):
    for folder in ("", str(tmp_path / "new" / "deeper"), str(tmp_path)):
        check_output_parameters(folder, ("accuracy",))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.bad_input
def test_prep_checks_output_parameters_before_it_writes_the_dataset(tmp_path, a_file, capsys):
    data = tmp_path / "data"
    code, _, err = run_cli(
        ["prep", "--output", data, "--output-parameters", a_file / "outputs"], capsys
    )
    assert code == 2
    one_line(err, "prep", f"{OPTION}: {a_file} is a file, not a folder")
    assert not data.exists()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    """A collected 64-8-10 MLP, as `kubetrain collect` publishes a torch.save'd state dict."""
    import torch
    from torch import nn

    from kubetrain.cli import main

    root = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.ReLU(), nn.Linear(8, 10))
    (root / "checkpoints").mkdir()
    torch.save(net.state_dict(), root / "checkpoints" / "model.pt")
    collect = ["collect", "--checkpoint-dir", root / "checkpoints", "--output", root / "model"]
    assert main([str(arg) for arg in collect]) == 0
    return root


@pytest.mark.bad_input
def test_collect_checks_output_parameters_before_it_publishes(tiny_model, tmp_path, a_file, capsys):
    output = tmp_path / "model"
    args = ["collect", "--checkpoint-dir", tiny_model / "checkpoints", "--output", output]
    code, _, err = run_cli([*args, "--output-parameters", a_file / "o"], capsys)
    assert code == 2
    one_line(err, "collect", f"{OPTION}: {a_file} is a file")
    assert not output.exists()


@pytest.mark.bad_input
def test_promote_checks_output_parameters_before_it_publishes(tiny_model, tmp_path, a_file, capsys):
    registry = tmp_path / "registry"
    args = ["promote", "--model", tiny_model / "model", "--registry", registry, "--version", "v1"]
    code, _, err = run_cli([*args, "--output-parameters", a_file / "o"], capsys)
    assert code == 2
    one_line(err, "promote", f"{OPTION}: {a_file} is a file")
    assert not registry.exists()


@pytest.mark.bad_input
def test_evaluate_checks_output_parameters_before_its_program_runs(tiny_model, tmp_path, capsys):
    """An output of the step that is a folder: found only once the metrics were written."""
    (tmp_path / "outputs" / "accuracy").mkdir(parents=True)
    ran = tmp_path / "ran"
    program = ["--", sys.executable, "-c", f"open({str(ran)!r}, 'w')"]
    args = ["evaluate", "--model", tiny_model / "model", "--metric", "loss", "--below", "1"]
    code, _, err = run_cli([*args, "--output-parameters", tmp_path / "outputs", *program], capsys)
    assert code == 2
    one_line(err, "evaluate", f"{OPTION}: ", "accuracy is a folder")
    assert not ran.exists()


# ----------------------------------------------------------------- evaluate -- CMD's inputs
@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("model", "data", "line"),
    [
        ("missing", "", "--model: model {tmp}/missing: no model.json; give a folder `kubetrain "),
        ("empty", "", "--model: model {tmp}/empty: no model.json; "),
        ("model", "missing", "--data: dataset {tmp}/missing: no manifest.json; give a folder "),
    ],
    ids=["missing-model", "not-a-model", "missing-data"],
)
def test_evaluate_with_your_program_refuses_inputs_before_it_runs(
    tiny_model, tmp_path, capsys, model, data, line
):
    (tmp_path / "empty").mkdir()
    (tmp_path / "model").symlink_to(tiny_model / "model")
    ran = tmp_path / "ran"
    program = ["--", sys.executable, "-c", f"open({str(ran)!r}, 'w')"]
    inputs = ["--model", tmp_path / model, *(["--data", tmp_path / data] if data else [])]
    code, _, err = run_cli(
        ["evaluate", *inputs, "--metric", "loss", "--below", "1", *program], capsys
    )
    assert code == 2
    one_line(err, "evaluate", line.format(tmp=tmp_path))
    assert not ran.exists(), "the program ran before its inputs were checked"


# ----------------------------------------------------------------- kubetrain run
#: Runs `kubetrain run ARGS` in this process, its exit code last.
RUN_PROBE = """
import json, sys
from kubetrain.cli import main
print(json.dumps({"code": main(["run", *sys.argv[1:]])}))
"""


def run_checked(folder: Path, *args: object, root: Path | None = None) -> tuple[int, list[str]]:
    """`kubetrain run ARGS` in ``folder``: its exit code and stderr lines."""
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", RUN_PROBE, *map(str, args)],
        capture_output=True,
        text=True,
        cwd=folder,
        timeout=60,
        env={"KUBETRAIN_LOCAL_ROOT": str(root or folder / "jobs"), "PATH": "/usr/bin:/bin"},
    )
    assert time.monotonic() - started < 30, "refused before the pipeline started"
    return json.loads(result.stdout.splitlines()[-1])["code"], result.stderr.splitlines()


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("args", "root", "line"),
    [
        (
            ["--model", "netdef:build", "--", "no-such-trainer", "train.py"],
            None,
            "command: 'no-such-trainer' is not found on PATH; give an installed program",
        ),
        (
            ["--registry", "{file}/registry"],
            None,
            "--registry: {file} is a file, not a folder, so {file}/registry cannot be made; ",
        ),
        (["--output", "{file}/runs"], None, "--output: {file} is a file, not a folder, so "),
        (
            ["--output", "{file}"],
            None,
            # the default registry lies under --output: --output names the cause first
            "--output: {file} is a file, not a folder; ",
        ),
        (["--storage", "{file}/store"], None, "--storage: {file} is a file, not a folder, so "),
        ([], "{file}/jobs", "KUBETRAIN_LOCAL_ROOT: {file} is a file, not a folder, so "),
    ],
    ids=["program-not-on-path", "registry-under-a-file", "output-under-a-file", "output-a-file",
         "storage-under-a-file", "job-root-under-a-file"],
)  # fmt: skip
def test_run_refuses_a_location_or_program_before_prep_writes(tmp_path, a_file, args, root, line):
    (tmp_path / "netdef.py").write_text("def build(shape, classes):\n    pass\n")
    filled = [arg.format(file=a_file) for arg in args]
    job_root = Path(root.format(file=a_file)) if root else None
    code, stderr = run_checked(tmp_path, *(filled or ["--output", "runs"]), root=job_root)
    assert code == 2
    one_line("\n".join(stderr), "run", line.format(file=a_file))
    assert not (tmp_path / "runs").exists() and not (tmp_path / "jobs").exists()


def test_run_finds_your_program_where_the_local_backend_does(tmp_path):
    """The same rule as the local backend: a path to a program, or a name on PATH."""
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    (tmp_path / "netdef.py").write_text("def build(shape, classes):\n    pass\n")
    for program in (str(script), "sh"):
        # accepted: the run then stops at the next check, a registry it cannot publish to
        code, stderr = run_checked(
            tmp_path, "--model", "netdef:build", "--registry", "", "--", program
        )
        assert code == 2
        one_line("\n".join(stderr), "run", "--registry: is empty")


# ----------------------------------------------------------------- submit kfp|argo
BAD_PARAMETERS = [
    (['command=["torchrun", 3]'], "--param command: ['torchrun', 3] is not a list of texts"),
    (['command=["torchrun", "a\\u0000b"]'], "--param command: 'a\\x00b' holds a NUL byte"),
    (['command=["", "train.py"]'], "command: is empty; give the program to run"),
    (['command=["torchrun", "train.py"]'], "--param model: mlp is our trainer's model, not "),
    (
        ['command=["torchrun", "train.py"]', "model=cnn"],
        "--param model: cnn is our trainer's model, not your program's",
    ),
    (["dataset_source=sklearn:digitz"], "--param dataset_source: unknown sklearn dataset 'digitz'"),
    (["dataset_source=mydata:load"], "--param dataset_source: unknown scheme 'mydata'"),
    (["dataset_source="], "--param dataset_source: is empty"),
]
BAD_IDS = ["not-texts", "nul", "empty-program", "program-default-mlp", "program-cnn",
           "unknown-sklearn", "unknown-scheme", "empty-source"]  # fmt: skip


@pytest.mark.bad_input
@pytest.mark.parametrize(("params", "message"), BAD_PARAMETERS, ids=BAD_IDS)
def test_submit_kfp_applies_the_steps_rules_before_contacting_the_server(
    kfp_api,  # noqa: F811
    capsys,
    params,
    message,
):
    host, received = kfp_api
    flags = [item for param in params for item in ("--param", param)]
    code, _, err = run_cli(["submit", "kfp", "--host", host, *flags], capsys)
    assert code == 2
    one_line(err, "submit", message)
    assert received == []


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("params", "message"),
    [
        # launch reads the Argo parameter as --command-json, which wants no empty part
        *[case for case in BAD_PARAMETERS[1:] if "is empty; give the program" not in case[1]],
        (['command=["", "train.py"]'], '--param command: \'["", "train.py"]\' is not a list'),
        (["command=torchrun x.py"], "--param command: 'torchrun x.py' is not JSON"),
        (['command=["torchrun", 3]'], "--param command: '[\"torchrun\", 3]' is not a list of"),
    ],
    ids=[
        *[name for name in BAD_IDS[1:] if name != "empty-program"],
        "empty-program",
        "not-json",
        "not-texts",
    ],  # fmt: skip
)
def test_submit_argo_applies_the_steps_rules_before_contacting_the_server(
    capsys, monkeypatch, params, message
):
    for name in [name for name in os.environ if name.startswith("ARGO_")]:
        monkeypatch.delenv(name)
    flags = [item for param in params for item in ("--param", param)]
    with ArgoServer() as server:
        code, _, err = run_cli(["submit", "argo", "--host", server.url, *flags], capsys)
        assert server.requests == []
    assert code == 2
    one_line(err, "submit", message)


def test_submit_sends_a_program_with_its_factory_and_a_source_on_the_pod(
    kfp_api,  # noqa: F811
    capsys,
):
    """A dataset path is one on the prep step's pod: it need not exist here."""
    host, received = kfp_api
    params = ['command=["torchrun", "train.py"]', "model=netdef:build",
              "dataset_source=/mnt/shared/data/mine.npz"]  # fmt: skip
    flags = [item for param in params for item in ("--param", param)]
    code, out, err = run_cli(["submit", "kfp", "--host", host, *flags], capsys)
    assert code == 0, err
    ((_, _, run),) = [r for r in received if r[0] == "POST" and "/runs" in r[1]]
    assert run["runtime_config"]["parameters"]["dataset_source"] == "/mnt/shared/data/mine.npz"


class FailingHealthz(FakeKfpApi):
    """A KFP API whose health check answers 503 (a proxy before a server that is down)."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self.received.append(("GET", self.path, {}))
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()


def test_a_kfp_server_failing_its_health_check_is_one_line(capsys, caplog, monkeypatch):
    """The KFP client retries its health check 5 times, logging each failure's traceback
    (kfp 2.17.3 kfp/client/client.py get_kfp_healthz); the user gets one line saying what the
    server answered. The client's 5-second sleeps between attempts are skipped here."""
    import threading
    from http.server import ThreadingHTTPServer

    import kfp.client.client

    monkeypatch.setattr(kfp.client.client.time, "sleep", lambda seconds: None)
    FailingHealthz.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FailingHealthz)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        code, _, err = run_cli(["submit", "kfp", "--host", host], capsys)
    finally:
        server.shutdown()
    assert code == 1
    one_line(err, "submit", f"could not create the run on {host}: ", "503 Service Unavailable")
    assert len(FailingHealthz.received) == 5
    assert [record for record in caplog.records if record.exc_info] == []
