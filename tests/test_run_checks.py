"""`kubetrain run` checks what it can before its first step (issue 18 (2)): a typo in --model
or --procs-per-node is one line in about a second, not a failure after prep; torch is not
imported for the check unless the user's module imports it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

#: Runs `kubetrain run ARGS` in this process and prints its exit code and whether the check
#: imported torch.
PROBE = """
import json, sys
from kubetrain.cli import main
code = main(["run", "--output", "runs", *sys.argv[1:]])
print(json.dumps({"code": code, "torch": "torch" in sys.modules}))
"""


def run_checked(folder: Path, *args: str) -> tuple[dict, list[str], float]:
    """The probe's result, its stderr lines and how long it took, run in ``folder``."""
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        capture_output=True,
        text=True,
        cwd=folder,
        timeout=60,
        env={"KUBETRAIN_LOCAL_ROOT": str(folder / "jobs"), "PATH": "/usr/bin:/bin"},
    )
    elapsed = time.monotonic() - started
    return json.loads(result.stdout.splitlines()[-1]), result.stderr.splitlines(), elapsed


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ("--model", "netdeff:build"),
            "model: cannot import module 'netdeff' (No module named 'netdeff'); ",
        ),
        (("--model", "netdef:biuld"), "model: module 'netdef' has no attribute 'biuld'; "),
        (("--model", "netdef:WIDTH"), "model: 'netdef:WIDTH' is not callable; "),
        (("--model", "broken:build"), "model: importing broken:build failed (SyntaxError: "),
        (("--procs-per-node", "0"), "--procs-per-node: 0 is below 1; give auto "),
        (("--procs-per-node", "x"), "--procs-per-node: 'x' is not a whole number or auto; "),
        # prep's sources are no callables: a module:callable is an unknown scheme
        (("--dataset", "mydata:load"), "--dataset: unknown scheme 'mydata' in 'mydata:load'; "),
    ],
)
def test_a_typo_is_refused_in_one_line_before_any_step(tmp_path, args, line):
    (tmp_path / "netdef.py").write_text("WIDTH = 64\n\ndef build(shape, classes):\n    pass\n")
    (tmp_path / "broken.py").write_text("def build(:\n")
    result, stderr, elapsed = run_checked(tmp_path, *args)
    assert result == {"code": 2, "torch": False}
    (only,) = stderr
    assert only.startswith(f"kubetrain run: error: {line}"), only
    assert not (tmp_path / "runs").exists() and not (tmp_path / "jobs").exists()
    assert elapsed < 20  # about a second alone; the shared test machine may be busy


def test_a_model_that_imports_is_accepted_and_torch_left_to_it(tmp_path):
    """The check passes (the run then stops at the next one, a registry it cannot publish to)
    without importing torch for a module that does not."""
    (tmp_path / "netdef.py").write_text("def build(shape, classes):\n    pass\n")
    result, stderr, _ = run_checked(tmp_path, "--model", "netdef:build", "--registry", "")
    assert result == {"code": 2, "torch": False}
    (only,) = stderr
    assert only.startswith("kubetrain run: error: --registry: is empty"), only
