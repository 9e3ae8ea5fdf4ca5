"""A local training script shipped with the job as a ConfigMap, mounted at /workspace.

How the command refers to the script: write the command as you would run it locally, e.g.
``--script train.py -- torchrun train.py``. In the rendered pod, every command or argument
that names the script (exactly as given to ``--script``, the same path normalised, or its
basename) becomes ``/workspace/<basename>``, where the ConfigMap is mounted. Only whole
arguments are rewritten (``--config=train.py`` is not). A command that names neither the
script nor ``/workspace/<basename>`` is refused: the shipped script would never run.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from kubetrain import rules
from kubetrain.errors import InvalidInput
from kubetrain.jobspec import MAX_SCRIPT_BYTES, SCRIPT_MOUNT_PATH, SCRIPT_VOLUME, TrainJobSpec
from kubetrain.render.metadata import (
    SCRIPT_SHA256_ANNOTATION,
    object_labels,
    object_metadata,
    validate_namespace,
)
from kubetrain.user_files import read_user_file


def script_configmap_name(job_name: str) -> str:
    return f"{job_name}-script"


def script_key(spec: TrainJobSpec) -> str:
    """The ConfigMap data key: the script's basename, which must be a valid key."""
    return rules.config_map_key(
        os.path.basename(spec.script),
        "script",
        "rename the file to letters, digits, '-', '_' and '.', e.g. train.py",
    )


def mounted_script_path(spec: TrainJobSpec) -> str:
    return f"{SCRIPT_MOUNT_PATH}/{script_key(spec)}"


def script_text(spec: TrainJobSpec) -> str:
    """The script's text, read no further than a ConfigMap holds (it may have grown)."""
    fix = f"ship a readable text .py file of at most {MAX_SCRIPT_BYTES} bytes"
    data = read_user_file(spec.script, "script", MAX_SCRIPT_BYTES, fix)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput("script", f"{spec.script} is not UTF-8 text", fix) from None


def script_sha256(spec: TrainJobSpec) -> str:
    """sha256 of the script's content; empty when no script is shipped."""
    if not spec.script:
        return ""
    return hashlib.sha256(script_text(spec).encode("utf-8")).hexdigest()


#: The launcher's program: make and enter ``FOLDER``; on node 0 (``PET_NODE_RANK`` "0" or
#: unset: every node's pod shares the folder) lock it as our trainer's rank 0 does
#: (``kubetrain.artifacts.checkpoint.lock_checkpoint_dir``: ``flock`` on ``FOLDER/.lock``, the
#: holder written as ``job_identity``'s JSON, no lock where the filesystem has none), the
#: descriptor left open across ``exec`` so the program holds the lock for its life; then run
#: ``CMD``. A second job on the folder stops at once with one line naming the holder, instead
#: of overwriting the first's files. A program that runs our trainer (``-m kubetrain.train``)
#: is not locked here: the trainer locks the folder itself, and a second lock would refuse it.
#: Standard library only: it runs on the user's image.
IN_FOLDER_CODE = """\
import errno, fcntl, json, os, socket, sys
from datetime import datetime, timezone

folder, program = sys.argv[1], sys.argv[2:]
LOCK = os.path.join(folder, ".lock")
FIX = "give each job its own --checkpoint-dir, or wait until that job ends"
MODULE_OPTIONS = ("-m", "--module")


def refuse(problem, fix):
    line = f"kubetrain: error: checkpoint_dir: {problem}; {fix}"
    sys.exit("".join(c if c.isprintable() else "?" for c in line))


def describe(raw):
    try:
        holder = json.loads(raw)
        parts = [f"{key} {holder[key]}" for key in ("job", "run_id", "host", "pid", "since")]
        return ", ".join(part for part in parts if not part.endswith(" None"))
    except (ValueError, TypeError, KeyError, RecursionError):
        return "a process that has not yet said who it is"


def runs_our_trainer():
    pairs = zip(program, program[1:])
    named = any(a in MODULE_OPTIONS and b == "kubetrain.train" for a, b in pairs)
    return named or "-mkubetrain.train" in program


try:
    os.makedirs(folder, exist_ok=True)
    os.chdir(folder)
except OSError as exc:
    refuse(f"cannot make or enter {folder} ({exc.strerror})", "give a folder this job can write")
if os.environ.get("PET_NODE_RANK", "0") in ("", "0") and not runs_our_trainer():
    try:
        fd = os.open(LOCK, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        refuse(f"cannot write {LOCK} ({exc.strerror})", "give a folder this job can write")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = describe(os.pread(fd, 64 * 1024, 0))
        problem = f"{folder} is being written by another job (its lock {LOCK} is held by: {holder})"
        refuse(problem, FIX)
    except OSError as exc:
        if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            refuse(f"cannot lock {LOCK} ({exc.strerror})", "check the volume that holds it")
        os.close(fd)  # a filesystem without locks: each job needs a folder of its own
    else:
        holder = {
            "job": os.environ.get("KUBETRAIN_JOB_NAME") or None,
            "run_id": os.environ.get("TORCHELASTIC_RUN_ID") or None,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "since": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder, sort_keys=True) + "\\n").encode(), 0)
        os.set_inheritable(fd, True)
os.execvp(program[0], program)
"""

#: Runs ``CMD...`` in ``FOLDER`` (made if missing), locked as above: ``python3 -c CODE FOLDER
#: CMD...``. Neither a TrainJob's trainer nor its runtimePatches can set a container's
#: workingDir (Trainer v2.3 API), so a spec's ``working_dir`` is this fixed launcher; the
#: folder and the program are its arguments, never parsed by a shell.
IN_FOLDER = ("python3", "-c", IN_FOLDER_CODE)


def node_program(spec: TrainJobSpec) -> tuple[list[str], list[str]]:
    """``(command, args)`` as a node's container runs them: the shipped script's mention
    rewritten to where it is mounted, in ``spec.working_dir`` when there is one."""
    command, args = command_with_mounted_script(spec)
    if not spec.working_dir:
        return command, args
    return list(IN_FOLDER), [spec.working_dir, *command, *args]


def command_with_mounted_script(spec: TrainJobSpec) -> tuple[list[str], list[str]]:
    """``(command, args)`` as the pod runs them; unchanged when no script is shipped."""
    command, args = list(spec.command), list(spec.args)
    if not spec.script:
        return command, args
    mounted = mounted_script_path(spec)
    names = {spec.script, os.path.normpath(spec.script), os.path.basename(spec.script)}

    def rewrite(part: str) -> str:
        return mounted if part in names or os.path.normpath(part) in names else part

    command, args = [rewrite(p) for p in command], [rewrite(p) for p in args]
    if mounted not in command + args:
        key = script_key(spec)
        raise InvalidInput(
            "script",
            f"no argument of the command names {key}, so the shipped script would not run",
            f"run it, e.g. --script {spec.script} -- torchrun {key}",
        )
    return command, args


def script_volume(spec: TrainJobSpec) -> dict[str, Any]:
    return {"name": SCRIPT_VOLUME, "configMap": {"name": script_configmap_name(spec.name)}}


def script_volume_mount() -> dict[str, Any]:
    return {"name": SCRIPT_VOLUME, "mountPath": SCRIPT_MOUNT_PATH, "readOnly": True}


def render_script_configmap(
    spec: TrainJobSpec, namespace: str = "default", *, owner: dict[str, Any] | None = None
) -> dict[str, Any]:
    """ConfigMap ``<job>-script`` holding the script under its basename; immutable, since a
    running job must keep the script it started with."""
    spec = spec.validate()
    if not spec.script:
        raise InvalidInput("script", "is empty", "give the local script to ship with --script")
    validate_namespace(namespace)
    text = script_text(spec)
    annotations = {SCRIPT_SHA256_ANNOTATION: hashlib.sha256(text.encode("utf-8")).hexdigest()}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_metadata(
            script_configmap_name(spec.name), namespace, object_labels(spec), owner, annotations
        ),
        "immutable": True,
        "data": {script_key(spec): text},
    }
