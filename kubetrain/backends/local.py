"""The local backend: a TrainJob run as processes on this machine, as the Trainer would run it.

``launch`` records the job and starts a detached supervisor (``local_supervisor``) that owns
the node processes, then returns at once. Everything else (``status``, ``wait``, ``logs``,
``delete``) reads the job's folder, so it works from any other process, as a separate
pipeline step does.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from kubetrain import atomic
from kubetrain.backends.base import CREATED, FAILED, JobStatus
from kubetrain.backends.cancel import sigterm_cancels
from kubetrain.backends.local_files import local_root, node_log, read_status, write_status
from kubetrain.backends.local_supervisor import program_path, signal_group
from kubetrain.backends.log_tail import LogTail
from kubetrain.errors import InvalidInput, JobNotFound, KubetrainError
from kubetrain.jobspec import TrainJobSpec

POLL_SECONDS = 0.05
DELETE_GRACE_SECONDS = 10.0
#: A cancelled wait must leave no process within 5 s (the supervisor's own grace is longer).
CANCEL_GRACE_SECONDS = 3.0


class LocalBackend:
    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = Path(root) if root is not None else local_root()

    def job_dir(self, name: str) -> Path:
        return self.root / name

    def existing_job_dir(self, name: str) -> Path:
        job_dir = self.job_dir(name)
        if not (job_dir / "status.json").is_file():
            raise JobNotFound(
                f"no local job named {name!r} under {self.root}; "
                f"list them with `ls {self.root}` or set KUBETRAIN_LOCAL_ROOT"
            )
        return job_dir

    def default_checkpoint_dir(self, name: str) -> str:
        return str(self.job_dir(name) / "checkpoints")

    def launch(self, spec: TrainJobSpec) -> str:
        spec.validate()
        if shutil.which(spec.command[0], path=program_path()) is None:
            raise InvalidInput(
                "command",
                f"{spec.command[0]!r} is not found on PATH",
                "give an installed program or a path to one",
            )
        job_dir = self.job_dir(spec.name)
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            job_dir.mkdir()
        except FileExistsError:
            raise InvalidInput(
                "name",
                f"a local job named {spec.name!r} already exists",
                f"choose another name or run `kubetrain delete --backend local {spec.name}`",
            ) from None
        atomic.write_json(job_dir / "job.json", {"spec": spec.to_dict(), "cwd": os.getcwd()})
        write_status(job_dir, JobStatus(name=spec.name, state=CREATED, created_at=time.time()))
        with open(job_dir / "supervisor.log", "ab") as supervisor_log:
            supervisor = subprocess.Popen(
                [sys.executable, "-m", "kubetrain.backends.local_supervisor", str(job_dir)],
                stdin=subprocess.DEVNULL,
                stdout=supervisor_log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        atomic.write_text(job_dir / "supervisor.pid", f"{supervisor.pid}\n")
        return spec.name

    def status(self, name: str) -> JobStatus:
        job_dir = self.existing_job_dir(name)
        status = read_status(job_dir)
        if not status.finished and not self._supervisor_alive(job_dir):
            # Re-read: the supervisor may have finished between the two reads.
            status = read_status(job_dir)
            if not status.finished:
                status.state, status.reason = FAILED, "SupervisorLost"
                status.message = "the local supervisor process died; see supervisor.log"
        return status

    def wait(
        self,
        name: str,
        timeout: float | None = None,
        on_log_line: Callable[[str], None] | None = None,
    ) -> JobStatus:
        job_dir = self.existing_job_dir(name)
        rank0_log = LogTail(node_log(job_dir, 0))
        deadline = None if timeout is None else time.monotonic() + timeout
        with sigterm_cancels() as cancel:
            while True:
                status = self.status(name)
                for line in rank0_log.read_lines(final=status.finished):
                    if on_log_line is not None:
                        on_log_line(line)
                if status.finished:
                    return status
                if cancel.signum is not None:
                    self.stop(name, CANCEL_GRACE_SECONDS)
                    raise KubetrainError(
                        f"stopped waiting for local job {name}: cancelled by "
                        f"{signal.Signals(cancel.signum).name}; stopped its processes (its logs "
                        f"stay in {job_dir}; `kubetrain delete {name}` removes them)",
                        exit_code=128 + cancel.signum,
                    )
                self._check_deadline(name, status, timeout, deadline)
                time.sleep(POLL_SECONDS)

    @staticmethod
    def _check_deadline(
        name: str, status: JobStatus, timeout: float | None, deadline: float | None
    ) -> None:
        if deadline is not None and time.monotonic() > deadline:
            raise KubetrainError(
                f"timed out after {timeout:g}s waiting for job {name} (state {status.state}); "
                "raise --timeout or check `kubetrain logs`",
                exit_code=124,
            )

    def logs(self, name: str, node: int | None = None, follow: bool = False) -> Iterator[str]:
        job_dir = self.existing_job_dir(name)
        status = read_status(job_dir)
        ranks = [node] if node is not None else [n.rank for n in status.nodes] or [0]
        tails = {rank: LogTail(node_log(job_dir, rank)) for rank in ranks}
        prefix = len(ranks) > 1
        while True:
            finished = not follow or self.status(name).finished
            for rank, tail in tails.items():
                for line in tail.read_lines(final=finished):
                    yield f"[node-{rank}] {line}" if prefix else line
            if finished:
                return
            time.sleep(POLL_SECONDS)

    def delete(self, name: str) -> None:
        self.stop(name, DELETE_GRACE_SECONDS)
        shutil.rmtree(self.job_dir(name))

    def stop(self, name: str, grace_seconds: float) -> None:
        """Stop every process of the job: SIGTERM to the supervisor (which stops the nodes
        and records the job as Failed), SIGKILL to whatever is left after ``grace_seconds``."""
        job_dir = self.existing_job_dir(name)
        supervisor_pid = self._supervisor_pid(job_dir)
        if supervisor_pid is not None and self._supervisor_alive(job_dir):
            signal_group(supervisor_pid, signal.SIGTERM)
            deadline = time.monotonic() + grace_seconds
            while self._supervisor_alive(job_dir) and time.monotonic() < deadline:
                time.sleep(POLL_SECONDS)
            signal_group(supervisor_pid, signal.SIGKILL)
        for node in read_status(job_dir).nodes:
            if node.pid is not None and node.exit_code is None:
                signal_group(node.pid, signal.SIGKILL)

    @staticmethod
    def _supervisor_pid(job_dir: Path) -> int | None:
        try:
            return int((job_dir / "supervisor.pid").read_text())
        except (FileNotFoundError, ValueError):
            return None

    def _supervisor_alive(self, job_dir: Path) -> bool:
        pid = self._supervisor_pid(job_dir)
        return pid is not None and process_alive(pid)


def process_alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (exited, not yet reaped) counts as gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
