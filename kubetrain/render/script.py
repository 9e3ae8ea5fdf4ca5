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


#: Runs ``CMD...`` in ``FOLDER`` (made if missing): ``python3 -c CODE FOLDER CMD...``. Neither
#: a TrainJob's trainer nor its runtimePatches can set a container's workingDir (Trainer v2.3
#: API), so a spec's ``working_dir`` is this fixed launcher; the folder and the program are
#: its arguments, never parsed by a shell.
IN_FOLDER = (
    "python3",
    "-c",
    "import os, sys; os.makedirs(sys.argv[1], exist_ok=True); os.chdir(sys.argv[1]); "
    "os.execvp(sys.argv[2], sys.argv[2:])",
)


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
