"""The rayjob backend end to end on the emulated cluster with the fake KubeRay v1.7.0 operator
(tests/support/fake_kuberay.py), whose head, worker and submitter are real local Ray processes:
a user's Ray Train script in seed 004's style (tests/support/seed_ray.py: a ``TorchTrainer`` of
2 gloo workers on one node, reporting checkpoints) goes through `kubetrain launch --backend
rayjob`, `wait` (the driver's output, from the submitter pod), `collect` of the checkpoint Ray
Train recorded last, `evaluate`, `logs` and `delete`. Checked on the way against Ray's own
clients (``JobSubmissionClient`` sees the job the submitter submitted, while it runs and once
it SUCCEEDED; ``ray.train.Result.from_path`` finds the checkpoint) and KubeRay's status
(Initializing, Running, Complete/SUCCEEDED); once ttlSecondsAfterFinished has passed
(shortened here) the RayCluster, its pods and every Ray process are gone while the submitter Job
and its log stay. Every request the CLI sends is granted by the packaged RBAC (the rayjob
full flow of tests/test_rbac_covers_emulator.py, run here once)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kubetrain.cli import main as kubetrain_main
from tests.support import seed_ray
from tests.support.processes import run_kubetrain
from tests.test_fake_kuberay import kuberay_cluster, ray_processes, wait_for  # noqa: F401
from tests.test_rbac_covers_emulator import requests_sent, ungranted, use_of

pytest.importorskip("ray", reason="the fake KubeRay runs Ray: kubetrain[ray]")

JOB = "ray-e2e"


def test_a_users_ray_train_script_runs_through_launch_wait_collect_evaluate_logs_delete(
    kuberay_cluster,  # noqa: F811
    digits_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from ray.job_submission import JobSubmissionClient
    from ray.train import Result

    project, checkpoints = tmp_path / "project", tmp_path / "checkpoints"
    script = seed_ray.write_program(project, num_workers=2)
    emulator, operator = kuberay_cluster.emulator, kuberay_cluster.operator
    seen: list[tuple[str, str]] = []

    def status() -> dict[str, Any]:
        """The RayJob's status, its (jobDeploymentStatus, jobStatus) noted when it changes."""
        found = (emulator.get("rayjobs", JOB) or {}).get("status") or {}
        state = (found.get("jobDeploymentStatus", ""), found.get("jobStatus", ""))
        if not seen or seen[-1] != state:
            seen.append(state)
        return found

    def pods_of_jobs() -> list[str | None]:
        """The Job each pod belongs to (None for a Ray node's)."""
        return [p["metadata"].get("labels", {}).get("job-name") for p in emulator.list("pods")]

    def running() -> dict[str, Any] | None:
        found = status()
        return found if found.get("jobStatus") == "RUNNING" else None

    with requests_sent() as sent:
        launch = ["launch", "--backend", "rayjob", "--name", JOB, "--nodes", "1"]
        placement = ["--procs-per-node", "2", "--data", str(digits_dir)]
        where = ["--checkpoint-dir", str(checkpoints)]
        assert kubetrain_main([*launch, *placement, *where, "--", "python", str(script)]) == 0
        assert capsys.readouterr().out.splitlines()[-1] == JOB

        # while the Ray job runs, Ray's own client sees the job the submitter submitted
        started = wait_for(running, 240, 0.2)
        cluster, job_id = started["rayClusterName"], started["jobId"]
        assert started["dashboardURL"] == f"{cluster}-head-svc.default.svc.cluster.local:8265"
        assert emulator.get("rayclusters", cluster)["status"]["state"] == "ready"
        node_types = [
            p["metadata"]["labels"].get("ray.io/node-type") for p in emulator.list("pods")
        ]
        assert sorted(map(str, node_types)) == ["None", "head", "worker"]  # None: the submitter
        client = JobSubmissionClient(operator.dashboard_url(cluster))
        info = client.get_job_info(job_id)
        assert (info.submission_id, str(info.status.value)) == (job_id, "RUNNING")
        assert info.entrypoint == emulator.get("rayjobs", JOB)["spec"]["entrypoint"]
        assert info.entrypoint.endswith(f"python {script}'"), info.entrypoint  # sh -c '...'

        assert kubetrain_main(["wait", "--backend", "rayjob", JOB, "--timeout", "300"]) == 0
        out = capsys.readouterr().out.splitlines()
        assert any(f"epoch {seed_ray.EPOCHS} loss" in line for line in out), out
        (trained,) = [line for line in out if line.startswith("trained: ")]
        assert out[-1].startswith(f"job {JOB} Complete"), out[-3:]
        assert client.get_job_info(job_id).status == "SUCCEEDED"
        done = status()
        assert (done["jobDeploymentStatus"], done["jobStatus"]) == ("Complete", "SUCCEEDED")
        assert done["endTime"] >= done["startTime"] and done["rayJobInfo"]["endTime"]
        assert seen.index(("Initializing", "")) < seen.index(("Running", "RUNNING"))
        assert seen[-1] == ("Complete", "SUCCEEDED")

        # the checkpoint Ray Train recorded last is the driver's result, and collect's
        run = checkpoints / seed_ray.RUN_NAME
        recorded = Path(Result.from_path(str(run)).checkpoint.path)
        assert trained == f"trained: {recorded}" and recorded.parent == run
        kept = sorted(path.name for path in run.glob("checkpoint_*") if path.is_dir())
        assert len(kept) == seed_ray.KEEP and recorded.name == kept[-1], kept
        model = tmp_path / "model"
        collect = ["collect", "--checkpoint-dir", str(checkpoints), "--output", str(model)]
        assert kubetrain_main(collect) == 0
        assert f"{recorded.name}/model.pt" in capsys.readouterr().out
        evaluated = run_kubetrain(
            "evaluate", "--model", str(model), "--data", str(digits_dir),
            "--model-factory", "netdef:build", "--threshold", "0.9", cwd=project,
        )  # fmt: skip
        assert evaluated.returncode == 0, evaluated.stdout + evaluated.stderr
        assert "passed" in evaluated.stdout

        # ttlSecondsAfterFinished (60 s as rendered; shortened, as `kubectl patch` would) later
        # KubeRay deletes the RayCluster; the submitter Job and its log stay
        assert emulator.get("rayjobs", JOB)["spec"]["ttlSecondsAfterFinished"] == 60
        emulator.patch("rayjobs", JOB, {"spec": {"ttlSecondsAfterFinished": 1}})
        wait_for(lambda: emulator.get("rayclusters", cluster) is None, 30)
        wait_for(lambda: pods_of_jobs() == [JOB], 30)  # the submitter's alone
        wait_for(lambda: not ray_processes(operator.temp_dirs), 30)
        submitter = emulator.get("jobs", JOB)
        assert submitter["metadata"]["ownerReferences"][0]["kind"] == "RayJob"
        assert submitter["status"]["succeeded"] == 1
        assert f"{JOB}-head-svc" in emulator.names("services")
        assert kubetrain_main(["logs", "--backend", "rayjob", "--follow", JOB]) == 0
        assert trained in capsys.readouterr().out.splitlines()

        # delete: KubeRay's finalizer lets the RayJob go, and the garbage collector its
        # submitter Job and that Job's pod
        assert kubetrain_main(["delete", "--backend", "rayjob", JOB]) == 0
        wait_for(lambda: emulator.get("rayjobs", JOB) is None, 30)
        wait_for(lambda: emulator.get("jobs", JOB) is None, 30)

    used = {(use.verb, use.resource) for use in (use_of(*request) for request in sent)}
    assert {("create", "rayjobs"), ("get", "pods/log"), ("delete", "rayjobs")} <= used, used
    assert ungranted(sent) == [], "rbac.yaml does not grant these"
