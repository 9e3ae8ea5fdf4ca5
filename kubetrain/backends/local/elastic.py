"""An elastic local job (``--nodes MIN:MAX``), played as Training Operator v1.9 runs a PyTorchJob
with an ``elasticPolicy``: one torchrun per node, all meeting in a c10d rendezvous, the job
going on while at least MIN nodes remain.

The environment of each node is what ``pkg/controller.v1/pytorch/elastic.go``
(``ElasticEnvVarGenerator.Generate``, v1.9.0) gives a Worker pod: PET_RDZV_ENDPOINT,
PET_RDZV_BACKEND (c10d), PET_NNODES "MIN:MAX", PET_MAX_RESTARTS; no PET_NODE_RANK nor
PET_MASTER_* (``envvar.go`` sets those only with a Master replica; c10d assigns the node
ranks itself). What one machine needs on top (``elastic_node_env``): a free port for the
endpoint, which node hosts the rendezvous store, the job's name as the rendezvous id, faster
rendezvous timings, and ``jobspec.ELASTIC_NODE_ENV``.

A node that ends with a non-zero code, or is killed, while the others go on is *lost*, not a
failed job. The supervisor starts it again, as the kubelet restarts a Worker's container under
restartPolicy OnFailure (what the pytorchjob backend renders for an elastic job), so the
job grows back to MAX: the new torchrun joins the running rendezvous, the others' agents see
it waiting and restart their workers at the larger size (torch 2.13's
torch/distributed/elastic/agent/server/api.py ``SimpleElasticAgent._invoke_run``, a HEALTHY
group with ``num_nodes_waiting()``: a restart that does not count against
``--max-restarts``), and the trainer resumes from its newest checkpoint. The join needs
``jobspec.ELASTIC_NODE_ENV``: with torch's shared store, node 0, rank 0 again, keeps the store
address it published in the first round only, the joining node waits for it in the new
round's keys, and node 0 fails after the store's 60 s read timeout with DistStoreError
(waiting for ``torchelastic/role_info/1``; pytorch/pytorch#147064). Those starts are bounded
by ``spec.max_restarts`` over the whole job, as ``runPolicy.backoffLimit`` bounds the
restarts summed over every pod (``pkg/core/job.go`` ``PastBackoffLimit``). A node lost with
no restart left ends the job when fewer than MIN nodes remain (the survivors' rendezvous
would otherwise wait for MIN until its join timeout, 600 s); with MIN or more the others go
on without it. The job is
Complete once a node exits 0 and every node has ended, whatever the others' codes: the
operator's rule for an elastic PyTorchJob, Succeeded when any Worker succeeded
(``pytorchjob_controller.go`` ``UpdateJobStatus``, ~line 409); a node still rejoining then
has nothing left to join and is stopped.

Each membership change is a ``kubetrain:`` notice in every node's log (`kubetrain wait`
streams node 0's; the live bar keeps the count in view): "node 1 lost (killed by SIGKILL);
continuing with 1 of 1..2 nodes; starting it again to rejoin (restart 1 of 3)", then "node 1
rejoined; 2 of 1..2 nodes" once its torchrun has started its workers, which it does only
after its rendezvous round completed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil

from kubetrain.backends import owned_processes
from kubetrain.backends.base import COMPLETE, FAILED, RUNNING, JobStatus, NodeStatus
from kubetrain.backends.local.env_references import expand_all
from kubetrain.backends.local.files import node_log, write_status
from kubetrain.backends.local.processes import JOB_ID_ENV, stop_marked_processes
from kubetrain.backends.local.supervisor import (
    GRACE_SECONDS,
    POLL_SECONDS,
    base_env,
    finish,
    free_port,
    start_error,
    start_failed,
    start_node,
    stop_nodes,
    with_our_interpreter,
)
from kubetrain.jobspec import ELASTIC_NODE_ENV, ELASTIC_RDZV_BACKEND, TrainJobSpec, rank_starter
from kubetrain.progress import NOTICE, membership, node_range

#: Each process of an elastic node carries ``<job id>:<node>`` here, so what a lost node
#: leaves (torchrun's workers run in sessions of their own) is stopped with it, as a
#: container's processes end with it.
NODE_ID_ENV = "KUBETRAIN_LOCAL_NODE"
#: torchrun's c10d rendezvous settings for nodes on one machine (``--rdzv-conf`` keys of
#: ``dynamic_rendezvous.create_handler``). A dead node leaves the rendezvous once it missed
#: ``keep_alive_max_attempt`` heartbeats ``keep_alive_interval`` s apart (torch's 5 s x 3: 15 s,
#: here 3 s: loopback heartbeats do not get lost); a round with MIN nodes waits
#: ``last_call_timeout`` (torch's 30 s) for more before it starts: local nodes start together,
#: so 3 s, room for one to import torch later than another on a busy machine.
RDZV_TIMINGS = "last_call_timeout=3,keep_alive_interval=1,keep_alive_max_attempt=3"


def elastic_node_env(spec: TrainJobSpec, rank: int, port: int, job_id: str) -> dict[str, str]:
    """The environment of elastic node ``rank``: ``base_env``, elastic.go's PET_* with the
    endpoint on this machine, and what one machine needs: ``is_host`` says node 0 hosts the
    rendezvous store (torch's own test matches the endpoint's host against this machine's
    names, and 127.0.0.1 matches for every node: whichever started first would host it, and
    its loss would end every node's rendezvous; a PyTorchJob's endpoint names worker-0's pod,
    the only one it matches); PET_RDZV_ID is the job's name (a PyTorchJob sets it only when
    ``rdzvId`` is given; torchrun's default is "none"): a stranger's torchrun that reaches a
    reused port meets no rendezvous of its own name, and torchrun's lines name the job);
    ``ELASTIC_NODE_ENV`` lets a started-again node join the running rendezvous."""
    return {
        **base_env(spec),
        **ELASTIC_NODE_ENV,
        "PET_NNODES": spec.nodes_text,
        "PET_NPROC_PER_NODE": str(spec.procs_per_node),
        "PET_RDZV_BACKEND": ELASTIC_RDZV_BACKEND,
        "PET_RDZV_ENDPOINT": f"127.0.0.1:{port}",
        "PET_RDZV_ID": spec.name,
        "PET_MAX_RESTARTS": str(spec.max_restarts),
        "PET_RDZV_CONF": f"is_host={1 if rank == 0 else 0},{RDZV_TIMINGS}",
        NODE_ID_ENV: f"{job_id}:{rank}",
    }


def lost_how(code: int) -> str:
    """How a lost node ended, as a notice says it: "killed by SIGKILL", "exit code 1"."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exit code {code}"


class ElasticJob:
    """The nodes of one elastic job and what the supervisor knows of them."""

    def __init__(self, job_dir: Path, spec: TrainJobSpec, cwd: str, status: JobStatus) -> None:
        self.job_dir, self.spec, self.status = job_dir, spec, status
        self.run_in = spec.working_dir or cwd
        self.job_id = os.environ[JOB_ID_ENV]
        self.port = free_port()  # one endpoint for the job's life, as a pod's env is fixed
        self.processes: dict[int, subprocess.Popen] = {}
        #: Nodes started again whose torchrun has not yet started workers (not yet rejoined).
        self.rejoining: set[int] = set()
        self.succeeded = False
        self.min_nodes = spec.min_nodes if spec.min_nodes is not None else spec.num_nodes
        #: torchrun (or torch.distributed.run) starts the node's workers only once its
        #: rendezvous round completed: a started-again node has rejoined then. Any other
        #: program is back as soon as it runs.
        self.joins_a_rendezvous = bool(rank_starter([*spec.command, *spec.args]))
        status.node_range = node_range(self.min_nodes, spec.num_nodes)

    def start(self, rank: int) -> None:
        env = elastic_node_env(self.spec, rank, self.port, self.job_id)
        program = with_our_interpreter([*self.spec.command, *self.spec.args])
        proc = start_node(self.job_dir, self.spec, self.run_in, rank, expand_all(program, env), env)
        self.processes[rank] = proc
        node = NodeStatus(rank=rank, pid=proc.pid, log=node_log(self.job_dir, rank).name)
        self.status.nodes[rank : rank + 1] = [node]

    @property
    def live(self) -> int:
        """Nodes training now: running, and not still rejoining."""
        return sum(
            1
            for node in self.status.nodes
            if node.exit_code is None and node.rank not in self.rejoining
        )

    @property
    def running(self) -> int:
        """Nodes whose process runs, rejoining ones included: they can still make MIN."""
        return sum(1 for node in self.status.nodes if node.exit_code is None)

    def notice(self, text: str) -> None:
        """A membership line in every node's log, where `kubetrain wait` and `logs` show it."""
        for rank in range(self.spec.num_nodes):
            with open(node_log(self.job_dir, rank), "a") as log:
                log.write(f"{NOTICE}{text}\n")

    def record(self) -> None:
        self.status.live_nodes = self.live
        write_status(self.job_dir, self.status)

    def follow(self, stop_requested: list[int]) -> tuple[str, str, str]:
        """Poll the nodes until the job ends, telling each node lost and rejoined: (state,
        reason, message)."""
        while True:
            if stop_requested:
                return FAILED, "Stopped", f"stopped by {signal.Signals(stop_requested[0]).name}"
            for node in self.status.nodes:
                if node.exit_code is not None:
                    continue
                proc = self.processes[node.rank]
                code = proc.poll()
                if code is None:
                    if node.rank in self.rejoining and _has_started_workers(proc):
                        self.rejoining.discard(node.rank)
                        self.notice(f"node {node.rank} rejoined; {self.membership()}")
                        self.record()
                    continue
                node.exit_code = code
                self.rejoining.discard(node.rank)
                if code == 0:
                    self.succeeded = True
                    self.stop_rejoining()
                elif not self.succeeded and (failed := self.lose(node.rank, code)):
                    return failed
                self.record()
            if all(node.exit_code is not None for node in self.status.nodes):
                # Every node ended and none was lost past recovery: one at least exited 0.
                return COMPLETE, "Completed", self.completed_message()
            time.sleep(POLL_SECONDS)

    def lose(self, rank: int, code: int) -> tuple[str, str, str] | None:
        """Node ``rank`` ended with ``code`` while the job runs: stop what it left, then start
        it again while restarts remain, go on without it while MIN nodes remain, else fail
        the job (the returned state)."""
        stop_marked_processes(NODE_ID_ENV, f"{self.job_id}:{rank}", 0.0)
        owned_processes.reap_adopted({proc.pid for proc in self.processes.values()})
        spec, status = self.spec, self.status
        lost, min_nodes = f"node {rank} lost ({lost_how(code)})", self.min_nodes
        fewer = f"{self.live} of {status.node_range} nodes left, fewer than MIN {min_nodes}"
        if status.restarts < spec.max_restarts:
            status.restarts += 1
            state = f"continuing with {self.membership()}" if self.live >= min_nodes else fewer
            self.notice(
                f"{lost}; {state}; starting it again to rejoin (restart {status.restarts} of "
                f"{spec.max_restarts})"
            )
            try:
                self.start(rank)
            except OSError as error:
                status.failed_rank = rank
                return FAILED, "StartError", start_error(self.job_dir, spec, rank, error)
            if self.joins_a_rendezvous:
                self.rejoining.add(rank)
            else:  # no rendezvous to wait for: it is back as it starts
                self.notice(f"node {rank} rejoined; {self.membership()}")
            return None
        if self.running < min_nodes:
            status.failed_rank = rank
            left = f"{self.running} of {status.node_range} nodes left, fewer than MIN {min_nodes}"
            message = (
                f"{lost}: {left}; no restarts left ({status.restarts} of {spec.max_restarts} used)"
            )
            self.notice(message)
            return FAILED, "NodeLost", message
        self.notice(f"{lost}; continuing with {self.membership()} (no restarts left)")
        return None

    def stop_rejoining(self) -> None:
        """A node exited 0, so the job is done: a node still rejoining has nothing left to
        join (it would wait for a rendezvous that closed, or a store that is gone)."""
        for rank in sorted(self.rejoining):
            self.notice(f"node {rank} stopped: the job finished before it rejoined")
            stop_marked_processes(NODE_ID_ENV, f"{self.job_id}:{rank}", GRACE_SECONDS)

    def membership(self) -> str:
        return membership(self.live, self.status.node_range)

    def completed_message(self) -> str:
        finished = sum(1 for node in self.status.nodes if node.exit_code == 0)
        lost = f", {self.status.restarts} restart(s) of lost nodes" if self.status.restarts else ""
        return f"{finished} of {self.status.node_range} nodes exited with code 0{lost}"


def _has_started_workers(proc: subprocess.Popen) -> bool:
    """Whether a node's torchrun has started its workers: it does so only once its
    rendezvous round completed, so a started-again node has rejoined the job."""
    try:
        return bool(psutil.Process(proc.pid).children())
    except psutil.Error:
        return False


def supervise_elastic(
    job_dir: Path, spec: TrainJobSpec, cwd: str, status: JobStatus, stop_requested: list[int]
) -> JobStatus:
    job = ElasticJob(job_dir, spec, cwd, status)
    status.nodes = []
    for rank in range(spec.num_nodes):
        try:
            job.start(rank)
        except OSError as error:
            start_failed(job_dir, spec, status, list(job.processes.values()), error)
            return status
    status.state, status.failed_rank = RUNNING, None
    status.started_at = status.started_at or time.time()
    job.record()
    state, reason, message = job.follow(stop_requested)
    # Its membership at the end: the nodes that finished the training, or those left.
    finished = sum(1 for node in status.nodes if node.exit_code == 0)
    status.live_nodes = finished if state == COMPLETE else job.live
    processes = list(job.processes.values())
    if left := stop_nodes(processes):  # the job ends whole, as its pods would
        print(f"stopped {len(left)} process(es) the job's programs left running")
    for node in status.nodes:
        if node.exit_code is None:
            node.exit_code = job.processes[node.rank].wait()
    return finish(job_dir, status, state, reason, message)
