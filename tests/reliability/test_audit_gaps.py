"""Refusals an audit could delete unnoticed (issue 14, item 9): with the ServiceAccount name,
toleration or PVC claim-name check removed from the product, no test failed.

Each case runs `kubetrain launch --backend trainer` against the emulated API server, as the
bad-input catalogue does: the bad value must end in one error line naming its field, with no
object and no write request on the server; the same launch with a good value must create the
TrainJob and carry that value into it, so the refusal is the check's doing.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from test_bad_input import TRAINER, WRITE_VERBS, assert_one_line_error

from kubetrain.cli import main

#: (field, option, bad value, good value, how the good value shows in the TrainJob).
CASES = [
    ("service_account", "--service-account", "Kube_Train", "kubetrain",
     '"serviceAccountName": "kubetrain"'),
    ("tolerations.effect", "--toleration", "nvidia.com/gpu:NoRun", "nvidia.com/gpu:NoSchedule",
     '"effect": "NoSchedule"'),
    ("tolerations.key", "--toleration", "gpu type:NoSchedule", "example.com/gpu:NoSchedule",
     '"key": "example.com/gpu"'),
    ("volumes.claim_name", "--volume", "data=Team_PVC:/mnt/data", "data=team-pvc:/mnt/data",
     '"claimName": "team-pvc"'),
]  # fmt: skip


def launch(k8s: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *argv: str) -> int:
    monkeypatch.setenv("KUBECONFIG", str(k8s.emulator.write_kubeconfig(tmp_path / "kubeconfig")))
    return main([*TRAINER, "--name", "audit", *argv])


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("field", "option", "bad", "good", "shown"), CASES, ids=[c[0] for c in CASES]
)
def test_a_bad_value_is_refused_and_a_good_one_reaches_the_trainjob(
    field: str,
    option: str,
    bad: str,
    good: str,
    shown: str,
    k8s: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    objects_before = k8s.emulator.object_keys()
    started = time.monotonic()
    assert launch(k8s, tmp_path, monkeypatch, f"{option}={bad}") == 2
    assert_one_line_error(capsys.readouterr().err, "kubetrain launch", field)
    assert k8s.emulator.object_keys() == objects_before
    writes = [r for r in k8s.emulator.requests(since=started) if r.verb in WRITE_VERBS]
    assert writes == [], writes

    assert launch(k8s, tmp_path, monkeypatch, f"{option}={good}") == 0, capsys.readouterr().err
    assert shown in json.dumps(k8s.emulator.get("trainjobs", "audit"))
