"""A user's text with terminal controls in it (ESC [ 31 m, the 8-bit CSI U+009B, DEL, BEL)
shows as visible ``\\xNN`` text wherever kubetrain prints it, through the real CLI: the error
line, the failing rank's lines before wait's error, argparse's usage errors, prep's class names,
doctor's line quoting the API server's message. No raw control reaches stdout or stderr."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kubetrain.errors import terminal_text
from tests.support.emulator import KubeEmulator
from tests.support.processes import kubetrain_in_process
from tests.support.processes import run_kubetrain as kubetrain

#: ESC [ 31 m (red), the same as an 8-bit CSI (U+009B), DEL, BEL.
HOSTILE = "\x1b[31m\u009b31m\x7f\x07"
ESCAPED = "\\x1b[31m\\x9b31m\\x7f\\x07"
#: Anything that can drive a terminal, but the newline and tab that separate and indent lines.
RAW_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")

pytestmark = pytest.mark.security


def assert_no_raw_control(*outputs: str) -> None:
    for output in outputs:
        assert not RAW_CONTROL.search(output), repr(output)


def test_terminal_text_escapes_c0_del_and_c1_and_keeps_tabs_and_text() -> None:
    assert terminal_text(HOSTILE) == ESCAPED
    assert terminal_text("a\nb\rc\x00\x85\x9f\xa0é\t✓") == "a\\x0ab\\x0dc\\x00\\x85\\x9f\xa0é\t✓"
    assert terminal_text(terminal_text(HOSTILE)) == ESCAPED  # escaping twice changes nothing


def test_argparse_usage_errors_are_escaped(capsys) -> None:
    """argparse quotes most values with repr(), but not an unrecognized argument (``%s``)."""
    code, out, err = kubetrain_in_process(["wait", "job", f"--{HOSTILE}"], capsys)
    assert code == 2
    assert f"unrecognized arguments: --{ESCAPED}" in err
    assert_no_raw_control(out, err)
    code, out, err = kubetrain_in_process(["wait", "job", "--timeout", HOSTILE], capsys)
    assert code == 2
    assert f"invalid float value: '{ESCAPED}'" in err
    assert_no_raw_control(out, err)


def test_prep_summary_escapes_class_names(tmp_path: Path) -> None:
    source = tmp_path / "data.npz"
    classes = np.array(["cat", f"dog{HOSTILE}", "bird\nfake line"])
    labels = np.arange(30) % 3
    np.savez(source, x=np.random.default_rng(0).normal(size=(30, 4)), y=labels, classes=classes)
    prepared = kubetrain("prep", "--source", str(source), "--output", str(tmp_path / "out"))
    assert prepared.returncode == 0, prepared.stderr
    assert f"classes (3): cat, dog{ESCAPED}, bird\\x0afake line" in prepared.stdout
    assert_no_raw_control(prepared.stdout, prepared.stderr)


CRASH = """\
import json
import os

import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 1:
    raise RuntimeError("boom \\x1b[31m\\u009b31m\\x7f\\x07 on rank 1")
dist.barrier()
"""


def test_a_failing_ranks_lines_and_the_error_line_are_escaped(local_root, tmp_path) -> None:
    """Rank 1 (node 1, which wait does not stream) raises with controls in its message: its
    traceback, printed before wait's error, and the error line naming it are escaped."""
    (tmp_path / "crash.py").write_text(CRASH)
    launched = kubetrain(
        "launch", "--backend", "local", "--nodes", "2", "--procs-per-node", "1",
        "--", "torchrun", "crash.py", cwd=tmp_path,
    )  # fmt: skip
    assert launched.returncode == 0, launched.stderr
    name = launched.stdout.strip().splitlines()[-1]
    waited = kubetrain("wait", "--backend", "local", name, "--timeout", "90", cwd=tmp_path)
    assert waited.returncode == 1, waited.stdout + waited.stderr
    lines = waited.stderr.splitlines()
    context = lines[lines.index("rank 1 failed on node 1:") : -1]
    assert f"[rank1]: RuntimeError: boom {ESCAPED} on rank 1" in context
    assert lines[-1].startswith("kubetrain wait: error: job ")
    assert f"RuntimeError: boom {ESCAPED} on rank 1" in lines[-1]
    assert_no_raw_control(waited.stdout, waited.stderr)


def test_doctor_escapes_the_servers_message(tmp_path) -> None:
    """The API server refuses the access review with a message holding controls: doctor's
    FAIL line quotes it escaped."""
    version = {"major": "1", "minor": "31", "gitVersion": "v1.31.0", "gitCommit": "0" * 40,
               "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
               "goVersion": "go1.23", "compiler": "gc", "platform": "linux/amd64"}  # fmt: skip
    forbidden = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 403,
                 "reason": "Forbidden", "message": f"forbidden {HOSTILE}"}  # fmt: skip
    with KubeEmulator() as emulator:
        emulator.api["get /version/"] << version
        emulator.api["post /apis/authorization.k8s.io/v1/subjectaccessreviews"] << 403 << forbidden
        emulator.install_trainer(version="2.3")
        kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
        env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        result = subprocess.run(
            [sys.executable, "-m", "kubetrain", "doctor", "--service-account", "kubetrain"],
            capture_output=True, text=True, timeout=60, env=env,
        )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert f"subjectaccessreviews.authorization.k8s.io (forbidden {ESCAPED})" in result.stdout
    assert_no_raw_control(result.stdout, result.stderr)


@pytest.mark.security
def test_list_escapes_a_job_folders_name_and_its_record(local_root, capsys) -> None:
    """A folder under the local root is anyone's: its name and a record's text are shown
    escaped, in the table and in the unreadable line."""
    folder = local_root / f"job{HOSTILE}"
    folder.mkdir(parents=True)
    (folder / "status.json").write_text(
        json.dumps({"name": f"job{HOSTILE}", "state": f"Complete{HOSTILE}", "created_at": "x"})
    )
    code, out, err = kubetrain_in_process(["list"], capsys)
    assert code == 0
    assert_no_raw_control(out, err)
    assert ESCAPED in out + err
