"""`kubetrain launch --storage-secret`: the nodes get the object-storage Secret by reference,
never its values."""

from __future__ import annotations

import json

from kubetrain.cli import build_parser
from kubetrain.components.launch_trainjob.cli import request_from_args
from kubetrain.components.launch_trainjob.launch import plan_launch
from kubetrain.render import render_indexed_job, render_trainjob
from kubetrain.render.pod import NODE, STORAGE_ENV_KEYS

SECRET = "team-a-s3"


def launch_spec(*extra: str):
    args = build_parser().parse_args(
        ["launch", "--backend", "trainer", "--name", "digits", "--storage-secret", SECRET]
        + ["--data", "s3://bucket/datasets/digits"]
        + ["--checkpoint-dir", "s3://bucket/checkpoints/digits", *extra]
    )
    return spec_and_checkpoints(args)


def spec_and_checkpoints(args):
    """The spec launch would create for the arguments, and the trainer's checkpoint folder."""
    from kubetrain.backends import get_backend

    plan = plan_launch(request_from_args(args), args.backend, get_backend(args.backend))
    return plan.spec, plan.checkpoint_dir


def test_urls_reach_the_trainer_command_unchanged() -> None:
    spec, checkpoint_dir = launch_spec()
    assert checkpoint_dir == "s3://bucket/checkpoints/digits"
    command = [*spec.command, *spec.args]
    assert command[command.index("--data") + 1] == "s3://bucket/datasets/digits"
    assert command[command.index("--checkpoint-dir") + 1] == checkpoint_dir


def test_trainjob_refers_to_the_secret_by_name_only() -> None:
    spec, _ = launch_spec()
    trainjob = render_trainjob(spec)
    env = trainjob["spec"]["trainer"]["env"]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in env if "valueFrom" in e}
    assert set(refs) == set(STORAGE_ENV_KEYS)
    assert all(ref == {"name": SECRET, "key": key, "optional": True} for key, ref in refs.items())
    assert not [e for e in env if e["name"] in STORAGE_ENV_KEYS and "value" in e]


def test_indexed_job_node_container_has_env_from_secret_ref() -> None:
    spec, _ = launch_spec()
    _service, job = render_indexed_job(spec)
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["name"] == NODE
    assert container["envFrom"] == [{"secretRef": {"name": SECRET}}]


def test_no_secret_no_reference(monkeypatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "must-not-leak")
    args = build_parser().parse_args(["launch", "--backend", "trainer", "--data", "/d"])
    spec, _ = spec_and_checkpoints(args)
    rendered = json.dumps([render_trainjob(spec), render_indexed_job(spec)])
    assert "secretRef" not in rendered and "secretKeyRef" not in rendered
    assert "must-not-leak" not in rendered


def test_secret_value_never_rendered(monkeypatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "must-not-leak")
    spec, _ = launch_spec()
    rendered = json.dumps([render_trainjob(spec), render_indexed_job(spec)])
    assert "must-not-leak" not in rendered and SECRET in rendered
