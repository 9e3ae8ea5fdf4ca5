"""A user's program through `kubetrain launch` (issue 28): its arguments reach it exactly as
typed, two live jobs never share a checkpoint folder, and what it would fail on here (a
missing --data, a checkpoint folder that is a file, a command no process can be given, an
outputs folder that cannot be written) is refused in one line before anything is created."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kubetrain.backends.local.backend import LocalBackend
from kubetrain.cli import main as kubetrain_main
from tests.reliability.test_bad_input import assert_one_line_error

#: A program that sleeps: a live job holding its checkpoint folder while the test runs.
SLEEPER = (sys.executable, "-c", "import time; time.sleep(60)")
#: A script as the Kubeflow SDK gives `bash -c` (its function written out, then run): longer
#: than a file name may be (NAME_MAX, 255), a fixed text handed to the shell as one argument
#: (no braces: the expected commands are formatted with the folder).
SDK_SCRIPT = (
    "\nread -r -d '' SCRIPT << EOM\n\n"
    "def train(parameters):\n"
    "    import torch\n\n"
    "    model = torch.nn.Linear(4, 2)\n"
    "    optimizer = torch.optim.SGD(model.parameters(), lr=parameters['lr'])\n"
    "    optimizer.step()\n"
    "    torch.save(model.state_dict(), 'model.pt')\n\n"
    "train(dict(lr=0.1))\n\n"
    "EOM\n"
    'printf "%s" "$SCRIPT" > "train.py"\n'
    'torchrun --nproc-per-node 1 "train.py"'
)


def launch_cli(*argv: str) -> int:
    return kubetrain_main(["launch", "--nodes", "1", *argv])


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (["python", "save.py", "--out", "model.pt"], ["python", "{}/save.py", "--out", "model.pt"]),
        (["torchrun", "--nproc-per-node", "2", "save.py", "model.pt"],
         ["torchrun", "--nproc-per-node", "2", "{}/save.py", "model.pt"]),
        (["/usr/bin/python3", "-u", "save.py", "model.pt"],
         ["/usr/bin/python3", "-u", "{}/save.py", "model.pt"]),
        (["python", "-m", "torch.distributed.run", "save.py", "model.pt"],
         ["python", "-m", "torch.distributed.run", "{}/save.py", "model.pt"]),
        (["./run.sh", "model.pt"], ["{}/run.sh", "model.pt"]),
        # No program file: every argument is the program's, as typed.
        (["python", "-c", "pass", "model.pt"], ["python", "-c", "pass", "model.pt"]),
        (["python", "-m", "mypkg.train", "model.pt"], ["python", "-m", "mypkg.train", "model.pt"]),
        (["cp", "model.pt", "copy.pt"], ["cp", "model.pt", "copy.pt"]),
        (["python", "missing.py", "model.pt"], ["python", "missing.py", "model.pt"]),
        (["python", "/abs/train.py", "model.pt"], ["python", "/abs/train.py", "model.pt"]),
        (["python", "./save.py", "model.pt"], ["python", "{}/save.py", "model.pt"]),
        # A text too long for a file name (the Kubeflow SDK's `bash -c SCRIPT`) is no file.
        (["bash", "-c", SDK_SCRIPT], ["bash", "-c", SDK_SCRIPT]),
        (["python", "x" * 300 + ".py"], ["python", "x" * 300 + ".py"]),
    ],
)  # fmt: skip
def test_only_the_program_file_is_found_in_the_launch_folder(tmp_path, command, expected):
    from kubetrain.components._shared.program import with_program_file_from

    for name in ("save.py", "model.pt", "run.sh"):
        (tmp_path / name).write_text("")
    found = with_program_file_from(str(tmp_path), command)
    assert list(found) == [part.format(tmp_path) for part in expected]


def test_a_programs_arguments_reach_it_as_typed_and_the_users_file_is_kept(
    local_root, tmp_path, monkeypatch
):
    """`-- python save.py --out model.pt` in a folder holding the user's own model.pt: the
    program gets ``--out model.pt`` and writes into its checkpoint folder (its working
    directory); the user's file is untouched (it was overwritten: the argument was rewritten
    to the launch folder's model.pt)."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "model.pt").write_text("the user's own model\n")
    (workspace / "save.py").write_text(
        "import json, sys\n"
        "out = sys.argv[sys.argv.index('--out') + 1]\n"
        "open(out, 'w').write(json.dumps(sys.argv[1:]))\n"
    )
    monkeypatch.chdir(workspace)
    program = ["--", sys.executable, "save.py", "--out", "model.pt"]
    assert launch_cli("--name", "saves", *program) == 0
    assert LocalBackend().wait("saves", timeout=60).state == "Complete"
    saved = local_root / "saves" / "checkpoints" / "model.pt"
    assert json.loads(saved.read_text()) == ["--out", "model.pt"]
    assert (workspace / "model.pt").read_text() == "the user's own model\n"
    LocalBackend().delete("saves")


@pytest.mark.bad_input
@pytest.mark.parametrize("where", ["same", "inside", "holding"])
def test_a_live_jobs_checkpoint_folder_is_refused_to_a_second_job(
    local_root, tmp_path, capsys, where
):
    """Our trainer locks its folder once its nodes run; a user's program takes no lock, so two
    jobs wrote each other's model.pt. Refused at launch, naming the job that holds it."""
    held = tmp_path / "shared" / "ckpt"
    assert launch_cli("--name", "first", "--checkpoint-dir", str(held), "--", *SLEEPER) == 0
    capsys.readouterr()
    second = {"same": held, "inside": held / "run2", "holding": held.parent}[where]
    try:
        code = launch_cli("--name", "second", "--checkpoint-dir", str(second), "--", *SLEEPER)
        assert code == 2
        line = assert_one_line_error(capsys.readouterr().err, "kubetrain launch", "checkpoint_dir")
        assert "first" in line and "--checkpoint-dir" in line
        assert not (local_root / "second").exists()
        assert not (held / "run2").exists()
    finally:
        LocalBackend().delete("first")
    # Once the first job is gone, the folder is free.
    assert launch_cli("--name", "second", "--checkpoint-dir", str(second), "--", *SLEEPER) == 0
    LocalBackend().delete("second")


@pytest.mark.bad_input
def test_our_trainers_folder_is_refused_to_a_users_program_too(
    local_root, tmp_path, digits_dir, capsys
):
    """The rule holds whichever program each job runs (our trainer held its lock only later,
    in its nodes; the second job's nodes failed after it was created)."""
    held = tmp_path / "ckpt"
    first = ["--name", "ours", "--data", str(digits_dir), "--checkpoint-dir", str(held)]
    assert launch_cli(*first, "--epochs", "50") == 0
    capsys.readouterr()
    try:
        assert launch_cli("--name", "theirs", "--checkpoint-dir", str(held), "--", *SLEEPER) == 2
        assert_one_line_error(capsys.readouterr().err, "kubetrain launch", "checkpoint_dir")
        assert not (local_root / "theirs").exists()
    finally:
        LocalBackend().delete("ours")


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("options", "field"),
    [
        (["--data", "{}/no-such-data"], "data"),
        (["--checkpoint-dir", "{}/a-file"], "checkpoint_dir"),
        (["--checkpoint-dir", "{}/a-file/under"], "checkpoint_dir"),
        (["--output-parameters", "{}/a-file/outputs"], "--output-parameters"),
        (["--command-json", '["python", "-c", "pass", "a\\u0000b"]'], "--command-json"),
        (["--command-json", '["python", "-c", "pass", "\\ud800"]'], "--command-json"),
        (["--command-json", "[" * 5000 + "]" * 5000], "--command-json"),
    ],
)
def test_a_users_program_is_refused_in_one_line_before_anything_is_created(
    local_root, tmp_path, capsys, options, field
):
    """Each was accepted (a job created that could only fail, or outputs that failed after
    the job was created) or ended in an internal error line."""
    (tmp_path / "a-file").write_text("not a folder\n")
    argv = [part.replace("{}", str(tmp_path)) for part in options]
    program = [] if "--command-json" in argv else ["--", sys.executable, "-c", "pass"]
    assert launch_cli("--name", "never", *argv, *program) == 2
    assert_one_line_error(capsys.readouterr().err, "kubetrain launch", field)
    assert not local_root.exists() or not any(local_root.iterdir())


def test_a_lone_surrogate_is_refused_from_the_pipeline_face_too(local_root):
    """The KFP component's list reaches plan_launch without --command-json's parsing."""
    from kubetrain.components.launch_trainjob.launch import (
        LaunchRequest,
        TrainingOptions,
        launch,
    )
    from kubetrain.errors import InvalidInput

    request = LaunchRequest(TrainingOptions(), command=("python", "-c", "pass", "\ud800"))
    with pytest.raises(InvalidInput) as refused:
        launch(request, backend="local")
    assert refused.value.field == "command"
    assert not Path(local_root).exists() or not any(local_root.iterdir())


@pytest.fixture
def held_by_a_trainer(tmp_path, monkeypatch):
    """A checkpoint folder whose lock our trainer's own function holds, as rank 0 of a job
    named trainer-elsewhere does for its whole run (launched from another root or machine)."""
    from kubetrain.artifacts.checkpoint import lock_checkpoint_dir

    def hold(folder: Path):
        monkeypatch.setenv("KUBETRAIN_JOB_NAME", "trainer-elsewhere")
        lock = lock_checkpoint_dir(folder)
        monkeypatch.delenv("KUBETRAIN_JOB_NAME")
        return lock

    return hold


def test_the_lock_file_is_the_trainers():
    from kubetrain.artifacts.checkpoint import LOCK_FILE
    from kubetrain.components.launch_trainjob.launch import CHECKPOINT_LOCK_FILE

    assert CHECKPOINT_LOCK_FILE == LOCK_FILE


@pytest.mark.bad_input
def test_a_folder_whose_lock_is_held_is_refused_locally(
    local_root, tmp_path, capsys, held_by_a_trainer
):
    """A job of another root (or a `python -m kubetrain.train` run by hand) holds the folder:
    no live job here says so, its lock does."""
    folder = tmp_path / "ckpt"
    lock = held_by_a_trainer(folder)
    program = ["--checkpoint-dir", str(folder), "--", *SLEEPER]
    assert launch_cli("--name", "second", *program) == 2
    line = assert_one_line_error(capsys.readouterr().err, "kubetrain launch", "checkpoint_dir")
    assert "trainer-elsewhere" in line and "--checkpoint-dir" in line
    assert not local_root.exists() or not any(local_root.iterdir())
    lock.release()  # the trainer ended: its lock file stays, held by nobody
    assert launch_cli("--name", "second", *program) == 0
    LocalBackend().delete("second")


@pytest.mark.bad_input
def test_a_held_folder_on_the_shared_volume_is_refused_before_the_trainjob(
    k8s, digits_dir, tmp_path, monkeypatch, held_by_a_trainer
):
    """On a cluster the launch step mounts the claim the nodes write on: a folder there whose
    lock a running job's rank 0 holds is refused before anything is copied or created."""
    from kubetrain.components.launch_trainjob.launch import (
        LaunchRequest,
        TrainingOptions,
        launch,
    )
    from kubetrain.errors import InvalidInput
    from kubetrain.jobspec import Volume

    monkeypatch.setenv("KUBECONFIG", str(k8s.emulator.write_kubeconfig(tmp_path / "kubeconfig")))
    shared = tmp_path / "shared"
    lock = held_by_a_trainer(shared / "checkpoints" / "taken")
    request = LaunchRequest(
        TrainingOptions(data_dir=str(digits_dir), epochs=1),
        name="taken",
        nodes=1,
        shared_volume=Volume(name="shared", claim_name="c", mount_path=str(shared)),
    )
    before = k8s.emulator.object_keys()
    with pytest.raises(InvalidInput, match="trainer-elsewhere") as refused:
        launch(request, backend="trainer")
    assert refused.value.field == "checkpoint_dir"
    assert not (shared / "datasets").exists()
    assert k8s.emulator.object_keys() == before
    lock.release()
