"""One error boundary: whatever a command meets (a full, read-only or foreign filesystem, a
path through a file, out of memory, a corrupt kubeconfig) ends as ONE stderr line
``kubetrain CMD: error: PATH: PROBLEM; FIX`` naming the path, never a traceback.

Real faults where the machine allows them (a tiny tmpfs for a full disk, a read-only tmpfs,
a file in the path, a folder where a file goes); the rest of the errno table (permission
denied cannot happen to root) through the lowest OS call of a real command (``os.replace``,
where every publish ends).
"""

from __future__ import annotations

import errno
import os
import sys

import pytest

from kubetrain import cli
from kubetrain.errors import DEBUG_ENV, OS_ERROR_FIXES
from tests.support.tiny_filesystem import (
    run_python_on_tiny_filesystem,
    tiny_filesystem_available,
)

PREP = ["prep", "--source", "sklearn:iris"]
CLI_PROGRAM = "import sys; from kubetrain.cli import main; sys.exit(main(sys.argv[1:]))"


def assert_one_line(stderr: str, command: str, *expected: str) -> str:
    """stderr is exactly one line ``kubetrain COMMAND: error: ...`` holding ``expected``."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, f"not one line:\n{stderr}"
    line = lines[0]
    assert line.startswith(f"kubetrain {command}: error: "), line
    assert "Traceback" not in stderr
    for text in expected:
        assert text in line, f"{text!r} not in {line!r}"
    return line


def run_cli(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    code = cli.main(argv)
    return code, capsys.readouterr().err


# ---------------------------------------------------------------------------- real faults
@pytest.mark.fault
@pytest.mark.parametrize(
    ("mount_options", "expected"),
    [
        # digits (~0.5 MB of float32) cannot fit in 16 KiB
        ("16k", ["No space left on device", OS_ERROR_FIXES[errno.ENOSPC]]),
        # prep may refuse it up front (exit 2) or meet EROFS: one line naming it either way
        ("1m,ro", []),
    ],
    ids=["disk-full", "read-only"],
)
def test_a_full_or_read_only_filesystem_is_one_line_naming_the_output(
    tmp_path, mount_options, expected, injected
):
    mount_point = tmp_path / "mnt"
    mount_point.mkdir()
    if not tiny_filesystem_available(mount_point):
        pytest.skip("no unprivileged mount namespace on this host")
    output = mount_point / "dataset"
    code = CLI_PROGRAM
    run = run_python_on_tiny_filesystem(
        mount_point,
        mount_options,
        ["-c", code, "prep", "--source", "sklearn:digits", "--output", str(output)],
    )
    assert run.returncode in (1, 2), run.stderr
    assert_one_line(run.stderr, "prep", str(mount_point), *expected)
    injected.struck(f"prep's output filesystem ({mount_options}) failed the write")


#: How many last lines of a failed node's log `wait` quotes (kubernetes.FAILURE_LOG_LINES).
QUOTED_LINES = 20


@pytest.mark.fault
@pytest.mark.parametrize(
    ("mount_options", "torchrun"),
    [("64k", True), ("200k", False), ("1m,ro", False)],
    ids=["model-under-torchrun", "optimizer", "read-only"],
)
def test_a_disk_full_while_checkpointing_names_the_folder_in_the_nodes_last_lines(
    tmp_path, digits_dir, free_port, mount_options, torchrun, injected
):
    """What `wait` quotes of a failed node says why and where: 64 KiB fills while writing
    the model (safetensors: "os error 28"; under torchrun, whose 30-line failure report
    follows the line, the report's root cause repeats it), 200 KiB while writing the
    optimizer (torch: "iostream error", no errno), and a read-only folder refuses the first
    write."""
    mount_point = tmp_path / "mnt"
    mount_point.mkdir()
    if not tiny_filesystem_available(mount_point):
        pytest.skip("no unprivileged mount namespace on this host")
    checkpoint_dir = mount_point / "checkpoints"
    env = {k: v for k, v in os.environ.items() if k != DEBUG_ENV}
    env["OMP_NUM_THREADS"] = "1"
    launcher = ["-m", "torch.distributed.run", "--nproc-per-node", "1"]
    launcher += ["--master-port", str(free_port()), "-m", "kubetrain.train"]
    args = [*(launcher if torchrun else ["-m", "kubetrain.train"])]
    args += ["--data", str(digits_dir), "--epochs", "1", "--checkpoint-dir", str(checkpoint_dir)]
    run = run_python_on_tiny_filesystem(mount_point, mount_options, args, env=env)
    assert run.returncode != 0, run.stderr
    quoted = run.stderr.splitlines()[-QUOTED_LINES:]
    ours = [line for line in quoted if "kubetrain.train: error: " in line]
    assert ours, run.stderr
    assert all(str(mount_point) in line for line in ours), ours
    if torchrun:
        assert any("traceback : kubetrain.train: error:" in line for line in ours), ours
    else:
        assert "Traceback" not in run.stderr, run.stderr
        assert quoted[-1].startswith("kubetrain.train: error: ")
    if "ro" not in mount_options:
        assert all("No space left on device" in line for line in ours), ours
        assert "epoch 1/1" in run.stdout, "the fault struck while checkpointing, after training"
        injected.struck("the checkpoint filesystem filled up while saving")
    else:
        injected.struck("the checkpoint folder refused the first write (read-only)")


@pytest.mark.bad_input
@pytest.mark.parametrize("depth", [0, 1, 2])
def test_an_output_path_through_a_file_is_one_line(tmp_path, capsys, depth):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    output = blocker.joinpath(*["sub"] * depth, "dataset")
    code, err = run_cli(capsys, [*PREP, "--output", str(output)])
    assert code != 0
    assert_one_line(err, "prep", str(blocker))
    assert blocker.read_text() == "x"


@pytest.mark.bad_input
def test_an_output_parameter_that_is_a_folder_is_one_line(tmp_path, capsys):
    parameters = tmp_path / "parameters"
    (parameters / "dataset_dir").mkdir(parents=True)
    argv = [*PREP, "--output", str(tmp_path / "data"), "--output-parameters", str(parameters)]
    code, err = run_cli(capsys, argv)
    assert code == 2  # refused before the dataset is written (pre-flight), not after
    assert_one_line(err, "prep", str(parameters / "dataset_dir"), "is a folder")
    assert not (tmp_path / "data").exists()


# ------------------------------------------------------- every errno, at the lowest OS call
@pytest.mark.fault
@pytest.mark.parametrize("code", sorted(OS_ERROR_FIXES), ids=errno.errorcode.get)
def test_every_os_error_of_a_publish_is_one_line_with_its_fix(
    tmp_path, capsys, monkeypatch, code, injected
):
    """os.replace fails as the kernel would (errno, strerror, both paths): the line names the
    path, the kernel's words and the fix for that errno."""
    real_replace = os.replace
    struck: list[str] = []

    def failing_replace(src, dst, *args, **kwargs):
        if "dataset" in str(dst):
            struck.append(str(dst))
            raise OSError(code, os.strerror(code), str(src), None, str(dst))
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", failing_replace)
    output = tmp_path / "dataset"
    exit_code, err = run_cli(capsys, [*PREP, "--output", str(output)])
    assert struck, "the fault did not strike"
    injected.struck(f"publishing {struck[0]} failed with {errno.errorcode[code]}")
    assert exit_code == 1
    assert_one_line(err, "prep", str(output), os.strerror(code), OS_ERROR_FIXES[code])


@pytest.mark.fault
def test_out_of_memory_is_one_line(tmp_path, capsys, monkeypatch, injected):
    import numpy as np

    struck: list[bool] = []

    def no_memory(*args, **kwargs):
        struck.append(True)
        raise MemoryError

    monkeypatch.setattr(np, "unique", no_memory)
    exit_code, err = run_cli(capsys, [*PREP, "--output", str(tmp_path / "d")])
    assert struck, "the fault did not strike"
    injected.struck("prep ran out of memory")
    assert exit_code == 1
    assert_one_line(err, "prep", "out of memory", "--memory")
    assert not (tmp_path / "d").exists()


def test_the_traceback_comes_with_the_debug_variable(tmp_path, capsys, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv(DEBUG_ENV, "1")
    code, err = run_cli(capsys, [*PREP, "--output", str(blocker / "dataset")])
    assert code != 0
    assert "Traceback" in err
    assert err.strip().splitlines()[-1].startswith("kubetrain prep: error: ")


def test_a_bug_is_reported_as_an_internal_error_not_hidden(tmp_path, capsys, monkeypatch):
    from kubetrain.components.dataset_prep import prep

    def buggy(**options):
        return 1 / 0

    monkeypatch.setattr(prep, "prepare_dataset", buggy)
    code, err = run_cli(capsys, [*PREP, "--output", str(tmp_path / "d")])
    assert code == 1
    assert_one_line(err, "prep", "internal error", "ZeroDivisionError", DEBUG_ENV)


# ----------------------------------------------------------- corrupt or foreign kubeconfig
KUBECONFIG_CONTENTS = {
    "truncated-json": b'{"apiVersion": "v1", "clusters": [',
    "unclosed-yaml": b"clusters: [a",
    "binary": b"\xff\xfe\x00\x01",
    "a-list": b"[]",
    "a-string": b'"hello"',
    "clusters-a-number": b"apiVersion: v1\nclusters: 3\n",
    "contexts-not-a-list": b"apiVersion: v1\ncontexts: {a: 1}\ncurrent-context: a\n",
}


@pytest.mark.bad_input
@pytest.mark.parametrize("content", KUBECONFIG_CONTENTS.values(), ids=KUBECONFIG_CONTENTS)
@pytest.mark.parametrize("argv", [["delete", "--backend", "trainer", "demo"], ["doctor"]])
def test_a_corrupt_kubeconfig_is_one_line_naming_it(tmp_path, capsys, monkeypatch, content, argv):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_bytes(content)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    code, err = run_cli(capsys, argv)
    assert code != 0
    assert_one_line(err, argv[0], str(kubeconfig))
    assert "internal error" not in err
    assert kubeconfig.read_bytes() == content


# ------------------------------------------------------------- corrupt or foreign package
PACKAGE_CONTENTS = {
    **{name: KUBECONFIG_CONTENTS[name] for name in ("truncated-json", "unclosed-yaml", "binary")},
    "a-list": b"[]",
    "root-a-number": b"root: 3\n",
    "parameters-a-list": b"root:\n  inputDefinitions:\n    parameters: [1, 2]\n",
    "parameter-without-type": b"root:\n  inputDefinitions:\n    parameters:\n      nodes: {}\n",
}


@pytest.mark.bad_input
@pytest.mark.parametrize("content", PACKAGE_CONTENTS.values(), ids=PACKAGE_CONTENTS)
def test_a_corrupt_kfp_package_is_one_line_naming_it(tmp_path, capsys, content):
    package = tmp_path / "pipeline.yaml"
    package.write_bytes(content)
    argv = ["submit", "kfp", "--host", "http://127.0.0.1:9", "--package", str(package)]
    code, err = run_cli(capsys, argv)
    assert code != 0
    assert_one_line(err, "submit", str(package))
    assert "internal error" not in err


# ------------------------------------------------------- every class the boundary knows
def _raise_json() -> None:
    import json

    json.loads('{"epoch": ')


def _raise_yaml() -> None:
    import yaml

    yaml.safe_load("a: [b")


def _raise_schema() -> None:
    import jsonschema

    schema = {"type": "object", "properties": {"epoch": {"type": "integer"}}}
    jsonschema.validate({"epoch": "one"}, schema)


def _raise_decode() -> None:
    b"\xff\xfe".decode()


def _raise_foreign() -> None:
    card = []
    card["model"]  # noqa: B018 - the failure under test


def _raise_os_error_in_text() -> None:
    raise RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")


def _raise_chained_os_error() -> None:
    try:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))
    except OSError as error:
        raise RuntimeError("write failed") from error


def _raise_memory() -> None:
    raise MemoryError


CONTENT_FAILURES = {
    "json": (_raise_json, "not valid JSON"),
    "yaml": (_raise_yaml, "not valid YAML"),
    "schema": (_raise_schema, "field epoch"),
    "not-utf8": (_raise_decode, "not UTF-8"),
    "foreign-shape": (_raise_foreign, "not the content kubetrain expects"),
    "os-error-in-message": (_raise_os_error_in_text, "No space left on device"),
    "os-error-as-cause": (_raise_chained_os_error, "Read-only file system"),
    "memory": (_raise_memory, "out of memory"),
}


@pytest.mark.parametrize(("fail", "problem"), CONTENT_FAILURES.values(), ids=CONTENT_FAILURES)
def test_each_failure_class_read_under_a_path_is_one_line_naming_it(tmp_path, fail, problem):
    from kubetrain.errors import failure_line, reading

    path = tmp_path / "manifest.json"
    with pytest.raises(BaseException) as raised, reading(path):
        fail()
    line, code = failure_line(raised.value)
    assert code == 1 and "\n" not in line
    assert line.startswith(f"{path}: ") and problem in line, line
    assert "internal error" not in line


@pytest.mark.security
def test_control_characters_in_an_error_line_are_written_out_not_sent_to_the_terminal(
    tmp_path, capsys
):
    """A user's factory whose exception text carries an escape sequence (or a file name with
    one): the one error line shows it as \\x1b, so it cannot recolour or move the terminal."""
    (tmp_path / "hostile_factory.py").write_text(
        "def build(shape, n):\n    raise ValueError('one\\ntwo \\x1b[2J\\x1b[31m red')\n"
    )
    from kubetrain.artifacts.models import build_model
    from kubetrain.errors import report_failure

    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(Exception) as raised:
            build_model("hostile_factory:build", [1, 8, 8], 10)
    finally:
        sys.path.remove(str(tmp_path))
    assert report_failure("kubetrain collect", raised.value) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and err.count("\n") == 1
    assert "raised ValueError: one two \\x1b[2J\\x1b[31m red" in err


@pytest.mark.security
def test_control_characters_in_a_failed_jobs_context_lines_are_written_out(capsys) -> None:
    """wait prints the failing rank's traceback before the error line: an escape sequence in the
    user's exception text is shown as \\x1b there too (tabs stay)."""
    from kubetrain.errors import KubetrainError, report_failure

    class Failed(KubetrainError):
        def context_lines(self) -> list[str]:
            return ["Traceback (most recent call last):", "\tx", "ValueError: \x1b[2Jboom"]

    assert report_failure("kubetrain wait", Failed("job failed")) == 1
    err = capsys.readouterr().err
    assert "\x1b" not in err and "ValueError: \\x1b[2Jboom" in err and "\tx" in err
