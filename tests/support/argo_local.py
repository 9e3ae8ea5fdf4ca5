"""Run a compiled Argo Workflow on this machine, so tests can execute the YAML we ship.

This is not an Argo emulator. It implements what kubetrain's workflows use and nothing more:
a DAG entrypoint and exit handler, container templates run as local processes, parameters,
artifacts passed between tasks, ``when``, ``retryStrategy`` and volume claims mapped onto host
folders. Every key of the document is checked against explicit allow-lists (``WORKFLOW``
below), so a workflow that starts using another Argo feature fails loudly with
``UnsupportedArgoFeature`` instead of being run wrongly.

Layout of ``workdir``::

    volumes/<claim>/             one folder per claim (``<workflow>-<name>`` for claim templates)
    nodes/<node>/main.log        stdout+stderr of every attempt of the node
    nodes/<node>/fs/...          the container's own paths (inputs, /tmp/kubetrain/outputs, ...)
    nodes/<node>/work/           the process's working directory
    artifacts/<node>/<artifact>  output artifacts, as Argo would store them in its repository

Container paths in ``command``/``args``/``env`` values are rewritten to host paths: a value
equal to a mount path, an input artifact path or an output path (or a parent folder of an
output), or starting with one followed by ``/``, the longest match winning. Other values are
left alone (e.g. ``shared=claim:/mnt/shared``). Output parameters therefore carry host paths
where on a cluster they would carry container paths; every step runs on the same host, so the
next step can use them as they are.

Differences from Argo worth knowing:

* ``depends`` may only be task names joined by ``&&`` (or a ``dependencies`` list). As in Argo,
  a plain name means "Succeeded or Skipped", so a task depending on a Skipped task runs.
* The DAG fails fast: after a Failed/Error task no further task starts; those left are
  ``Omitted``. Tasks run one at a time, in dependency order.
* ``when`` is only ``X == Y`` / ``X != Y`` (or ``true``/``false``), compared as strings.
* Backoff durations are not waited for; attempts are counted. A ``retryStrategy.expression``
  is evaluated after each failed attempt, as Argo's controller does (``argo_expr``).
* Undeclared workflow arguments and task arguments a template does not declare are errors.

What a step's process sees is what a main container gets: the host's environment (PATH, the
test's variables) less any pod identity the host may hold (``POD_*``, ``KFP_POD_*``,
``ARGO_*``, ``KUBETRAIN_OWNER_*``), then the template's ``env`` (``value``, or a downward-API
``fieldRef`` resolved against the step's pod), then the variables Argo's controller appends to
every container (argo-workflows v4.1.2 ``workflow/controller/workflowpod.go`` ``createWorkflowPod``:
``ARGO_CONTAINER_NAME``, ``ARGO_NODE_ID``, ``ARGO_INCLUDE_SCRIPT_OUTPUT``, ``ARGO_DEADLINE``,
``ARGO_WORKFLOW_NAME``; ``ARGO_POD_NAME``/``ARGO_POD_UID`` are the executor containers' only,
``createEnvVars``). The pod is named as Argo names it (``workflow/util/pod_name.go``
``GeneratePodName`` v2: ``<workflow>-<template>-<fnv32a(node name)>``; the node id is
``<workflow>-<fnv32a(node name)>``). Given an ``emulator`` (``tests.support.KubeEmulator`` with
the Workflow CRD installed), the Workflow is created there and every attempt's pod too, owned
by the Workflow (controller reference) and labelled ``workflows.argoproj.io/workflow``, as the
controller creates them, Running while the process runs, then Succeeded or Failed.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import string
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tests.support.argo_expr import UnsupportedExpression, evaluate_bool

__all__ = [
    "ArgoWorkflowError",
    "NodeResult",
    "UnsupportedArgoFeature",
    "WorkflowRun",
    "run_workflow",
]

Phase = Literal["Succeeded", "Failed", "Error", "Skipped", "Omitted"]
SUCCEEDED, FAILED, ERROR, SKIPPED, OMITTED = "Succeeded", "Failed", "Error", "Skipped", "Omitted"
#: Pause between attempts instead of the template's backoff.
RETRY_PAUSE_SECONDS = 0.01
NAME_SUFFIX_CHARS = string.ascii_lowercase + string.digits

# ---------------------------------------------------------------------------------------------
# The allow-lists. A mapping lists the keys allowed at that level (with the schema of each
# value); a one-element list means "a list of these"; ANY accepts the value without looking
# inside (fields we read as plain values, or accept and ignore).
ANY = None

PARAMETER_ARGUMENT = {"name": ANY, "value": ANY}
TASK = {
    "name": ANY,
    "template": ANY,
    "arguments": {"parameters": [PARAMETER_ARGUMENT], "artifacts": [{"name": ANY, "from": ANY}]},
    "depends": ANY,
    "dependencies": ANY,
    "when": ANY,
}
CONTAINER = {
    "command": ANY,
    "args": ANY,
    "env": [
        {
            "name": ANY,
            "value": ANY,
            "valueFrom": {"fieldRef": {"fieldPath": ANY, "apiVersion": ANY}},
        }
    ],
    "volumeMounts": [{"name": ANY, "mountPath": ANY, "readOnly": ANY}],
    # Accepted and ignored: there are no images, resource limits or pod security contexts
    # on this machine (steps run as the user running the harness).
    "image": ANY,
    "imagePullPolicy": ANY,
    "resources": ANY,
    "securityContext": ANY,
}
TEMPLATE = {
    "name": ANY,
    "dag": {"tasks": [TASK]},
    "container": CONTAINER,
    "inputs": {
        "parameters": [{"name": ANY, "default": ANY, "description": ANY}],
        "artifacts": [{"name": ANY, "path": ANY}],
    },
    "outputs": {
        "parameters": [{"name": ANY, "valueFrom": {"path": ANY}, "description": ANY}],
        "artifacts": [{"name": ANY, "path": ANY, "archive": ANY}],  # archive: ignored
    },
    "retryStrategy": {
        "limit": ANY,
        "retryPolicy": ANY,
        "expression": ANY,  # evaluated after each failed attempt (argo_expr)
        "backoff": {"duration": ANY, "factor": ANY, "maxDuration": ANY},  # not waited for
    },
    # Accepted and ignored.
    "serviceAccountName": ANY,
    "metadata": ANY,
}
SPEC = {
    "entrypoint": ANY,
    "onExit": ANY,
    "templates": [TEMPLATE],
    "arguments": {"parameters": [{"name": ANY, "value": ANY, "description": ANY}]},
    "volumeClaimTemplates": [{"metadata": ANY, "spec": ANY}],
    "volumes": [{"name": ANY, "persistentVolumeClaim": {"claimName": ANY, "readOnly": ANY}}],
    # Accepted and ignored: garbage collection and identity do not apply here.
    "podGC": ANY,
    "ttlStrategy": ANY,
    "volumeClaimGC": ANY,
    "serviceAccountName": ANY,
    "securityContext": ANY,
}
WORKFLOW = {"apiVersion": ANY, "kind": ANY, "metadata": ANY, "spec": SPEC}

RETRY_POLICIES = {
    # policy -> the attempt phases it retries
    "Always": {FAILED, ERROR},
    "OnFailure": {FAILED},
    "OnError": {ERROR},  # only harness-level errors, never a non-zero exit
}
DEFAULT_RETRY_POLICY = "OnFailure"  # Argo's default...
#: ...but with an expression and no policy, only the expression decides (Argo 3.5+,
#: docs/retries.md).
DEFAULT_RETRY_POLICY_WITH_EXPRESSION = "Always"

VARIABLE = re.compile(r"\{\{(.*?)\}\}")
#: Host variables that would lend a step an identity no Argo pod has.
POD_IDENTITY = ("POD_", "KFP_POD_", "ARGO_", "KUBETRAIN_OWNER_")
WORKFLOW_LABEL = "workflows.argoproj.io/workflow"
#: ``pb.getDeadline`` without an activeDeadlineSeconds: Go's zero time in RFC 3339.
NO_DEADLINE = "0001-01-01T00:00:00Z"
TASK_NAME = re.compile(r"[A-Za-z0-9][-A-Za-z0-9]*")


class UnsupportedArgoFeature(Exception):
    """A field or expression this harness does not implement (``field`` names it)."""

    def __init__(self, field: str, detail: str = "") -> None:
        self.field = field
        message = f"unsupported Argo feature: {field}"
        super().__init__(f"{message} ({detail})" if detail else message)


class ArgoWorkflowError(ValueError):
    """The workflow or its arguments are invalid: Argo would reject them too."""


@dataclass
class NodeResult:
    """One DAG task as it ended; ``outputs`` are its output parameters."""

    name: str
    template: str
    phase: Phase
    exit_code: int | None = None
    attempts: int = 0
    outputs: dict[str, str] = field(default_factory=dict)
    artifacts: dict[str, Path] = field(default_factory=dict)
    log: str = ""


@dataclass
class WorkflowRun:
    name: str
    phase: Phase  # Succeeded, Failed or Error
    nodes: dict[str, NodeResult]
    exit_nodes: dict[str, NodeResult]
    workdir: Path


@dataclass
class _Run:
    """What every node of one workflow run sees."""

    name: str
    namespace: str
    workdir: Path
    parameters: dict[str, str]
    templates: dict[str, dict[str, Any]]
    volumes: dict[str, Path]  # volume name -> host folder
    env: dict[str, str]
    task_timeout: float
    status: str | None = None  # {{workflow.status}}, set for the exit handler
    emulator: Any = None  # tests.support.KubeEmulator holding the Workflow and step pods
    workflow: dict[str, Any] | None = None  # the Workflow as stored there
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))  # {{workflow.uid}}

    def scope(self) -> dict[str, str]:
        """The ``workflow.*`` variables."""
        scope = {
            "workflow.name": self.name,
            "workflow.namespace": self.namespace,
            "workflow.uid": self.uid,
        }
        scope.update({f"workflow.parameters.{k}": v for k, v in self.parameters.items()})
        if self.status is not None:
            scope["workflow.status"] = self.status
        return scope


def run_workflow(
    document: dict[str, Any],
    *,
    workdir: Path,
    arguments: dict[str, str] | None = None,
    name: str | None = None,
    namespace: str = "default",
    env: dict[str, str] | None = None,
    task_timeout: float = 600,
    emulator: Any = None,
) -> WorkflowRun:
    """Run ``document`` (a Workflow) to completion, exit handler included, as ``argo submit
    -p NAME=VALUE`` of ``arguments`` would on a cluster; with ``emulator``, the Workflow and
    its pods exist there too."""
    check_supported(document)
    spec = document["spec"]
    name = name or workflow_name(document)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    templates = {template["name"]: template for template in spec["templates"]}
    run = _Run(
        name=name,
        namespace=namespace,
        workdir=workdir,
        parameters=workflow_parameters(spec, arguments or {}),
        templates=templates,
        volumes=volumes(spec, name, workdir),
        env=dict(env or {}),
        task_timeout=task_timeout,
        emulator=emulator,
    )
    if emulator is not None:
        stored = {**document, "metadata": {**document.get("metadata", {}), "name": name}}
        stored["metadata"].pop("generateName", None)
        run.workflow = emulator.create("workflows", stored, namespace)
        run.uid = run.workflow["metadata"]["uid"]
    nodes = run_dag(run, dag_template(templates, spec.get("entrypoint"), "spec.entrypoint"), "")
    phase = dag_phase(nodes)
    exit_nodes: dict[str, NodeResult] = {}
    if spec.get("onExit"):
        run.status = phase
        exit_nodes = run_dag(run, dag_template(templates, spec["onExit"], "spec.onExit"), "onExit.")
        if phase == SUCCEEDED:
            phase = dag_phase(exit_nodes)
    return WorkflowRun(name=name, phase=phase, nodes=nodes, exit_nodes=exit_nodes, workdir=workdir)


# --- checking the document -------------------------------------------------------------------


def check_supported(document: dict[str, Any]) -> None:
    """Raise UnsupportedArgoFeature for any key outside the allow-lists, before anything runs."""
    if not isinstance(document, dict):
        raise ArgoWorkflowError("the document is not a mapping")
    if document.get("kind") != "Workflow":
        raise UnsupportedArgoFeature("kind", f"{document.get('kind')!r}; only Workflow is run")
    check_keys(document, WORKFLOW, "")
    if not isinstance(document.get("spec"), dict):
        raise ArgoWorkflowError("the workflow has no spec")
    for template in document["spec"].get("templates", []):
        where = f"spec.templates[{template.get('name')}]"
        if ("dag" in template) == ("container" in template):
            raise ArgoWorkflowError(f"{where} must have exactly one of dag and container")


def check_keys(value: Any, schema: Any, where: str) -> None:
    if schema is ANY:
        return
    if isinstance(schema, list):
        if not isinstance(value, list):
            raise ArgoWorkflowError(f"{where} must be a list")
        for index, item in enumerate(value):
            label = item.get("name", index) if isinstance(item, dict) else index
            check_keys(item, schema[0], f"{where}[{label}]")
        return
    if not isinstance(value, dict):
        raise ArgoWorkflowError(f"{where} must be a mapping")
    for key, item in value.items():
        path = f"{where}.{key}" if where else key
        if key not in schema:
            raise UnsupportedArgoFeature(path)
        check_keys(item, schema[key], path)


def workflow_name(document: dict[str, Any]) -> str:
    """``metadata.name``, else ``generateName`` plus 5 random characters, as Kubernetes does."""
    metadata = document.get("metadata") or {}
    if metadata.get("name"):
        return str(metadata["name"])
    if metadata.get("generateName"):
        suffix = "".join(secrets.choice(NAME_SUFFIX_CHARS) for _ in range(5))
        return f"{metadata['generateName']}{suffix}"
    raise ArgoWorkflowError("metadata needs name or generateName")


def workflow_parameters(spec: dict[str, Any], arguments: dict[str, str]) -> dict[str, str]:
    """The declared parameters' values with ``arguments`` applied; an undeclared argument is an
    error (stricter than ``argo submit -p``, so a typo cannot go unnoticed)."""
    declared = {p["name"]: p.get("value") for p in spec.get("arguments", {}).get("parameters", [])}
    unknown = sorted(set(arguments) - set(declared))
    if unknown:
        raise ArgoWorkflowError(
            f"workflow parameter(s) {', '.join(unknown)} not declared in spec.arguments.parameters"
            f" (declared: {', '.join(declared)})"
        )
    values = {**declared, **arguments}
    missing = sorted(name for name, value in values.items() if value is None)
    if missing:
        raise ArgoWorkflowError(f"workflow parameter(s) {', '.join(missing)} need a value")
    return {name: str(value) for name, value in values.items()}


def volumes(spec: dict[str, Any], workflow: str, workdir: Path) -> dict[str, Path]:
    """Each volume name's host folder, named after its claim like Argo names it."""
    claims = {}
    for template in spec.get("volumeClaimTemplates", []):
        volume = (template.get("metadata") or {}).get("name")
        if not volume:
            raise ArgoWorkflowError("spec.volumeClaimTemplates[]: metadata.name is required")
        claims[volume] = f"{workflow}-{volume}"
    for volume in spec.get("volumes", []):
        if "persistentVolumeClaim" not in volume:
            raise UnsupportedArgoFeature(f"spec.volumes[{volume['name']}]", "only claims")
        claims[volume["name"]] = volume["persistentVolumeClaim"]["claimName"]
    folders = {}
    for volume, claim in claims.items():
        folders[volume] = workdir / "volumes" / claim
        folders[volume].mkdir(parents=True, exist_ok=True)
    return folders


def dag_template(templates: dict[str, Any], name: Any, where: str) -> dict[str, Any]:
    template = templates.get(name)
    if template is None:
        raise ArgoWorkflowError(f"{where}: no template named {name!r}")
    if "dag" not in template:
        raise UnsupportedArgoFeature(f"{where}: {name}", "only a dag template is run there")
    return template


# --- expressions -----------------------------------------------------------------------------


def substitute(text: Any, scope: dict[str, str], where: str) -> str:
    """Replace every ``{{name}}``; one this harness cannot resolve here is unsupported."""

    def replace(match: re.Match[str]) -> str:
        key = match.group(1).strip()
        if key not in scope:
            raise UnsupportedArgoFeature(
                match.group(0), f"in {where}: not a variable this harness resolves there"
            )
        return scope[key]

    return VARIABLE.sub(replace, str(text))


def when_holds(expression: str, where: str) -> bool:
    """Evaluate a substituted ``when``: ``X == Y``, ``X != Y``, ``true`` or ``false``."""
    text = expression.strip()
    if text in ("true", "false"):
        return text == "true"
    operators = [op for op in ("==", "!=") if op in text]
    if len(operators) != 1 or text.count(operators[0]) != 1 or re.search(r"&&|\|\||[<>()]", text):
        raise UnsupportedArgoFeature(f"{where}.when", f"only X == Y or X != Y: {expression!r}")
    left, right = (unquote(side) for side in text.split(operators[0]))
    return (left == right) == (operators[0] == "==")


def unquote(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def dependencies(task: dict[str, Any], where: str) -> list[str]:
    """The tasks ``task`` waits for: ``depends: a && b`` or ``dependencies: [a, b]``."""
    if "depends" in task and "dependencies" in task:
        raise ArgoWorkflowError(f"{where}: depends and dependencies are exclusive")
    if "dependencies" in task:
        return [str(name) for name in task["dependencies"] or []]
    if not task.get("depends"):
        return []
    names = [part.strip() for part in str(task["depends"]).split("&&")]
    if not all(TASK_NAME.fullmatch(name) for name in names):
        raise UnsupportedArgoFeature(
            f"{where}.depends", f"only task names joined by &&: {task['depends']!r}"
        )
    return names


def topological_order(tasks: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """The tasks, each after those it depends on, else in declaration order. Tasks run one at a
    time and the DAG fails fast, so a task that runs finds its dependencies Succeeded or
    Skipped: what a plain ``depends: name`` asks for."""
    waits = {task["name"]: dependencies(task, f"{where}[{task['name']}]") for task in tasks}
    for name, deps in waits.items():
        for dep in deps:
            if dep not in waits:
                raise ArgoWorkflowError(f"{where}[{name}] depends on unknown task {dep!r}")
    order: list[dict[str, Any]] = []
    done: set[str] = set()
    pending = list(tasks)
    while pending:
        ready = [task for task in pending if set(waits[task["name"]]) <= done]
        if not ready:
            raise ArgoWorkflowError(
                f"{where}: dependency cycle among {[t['name'] for t in pending]}"
            )
        task = ready[0]
        order.append(task)
        done.add(task["name"])
        pending.remove(task)
    return order


# --- the DAG ---------------------------------------------------------------------------------


def run_dag(run: _Run, template: dict[str, Any], prefix: str) -> dict[str, NodeResult]:
    """Run the DAG's tasks in dependency order, failing fast; ``prefix`` keeps the exit
    handler's node folders apart from the main DAG's."""
    where = f"spec.templates[{template['name']}].dag.tasks"
    results: dict[str, NodeResult] = {}
    artifacts: dict[str, Path] = {}
    stopped = False
    for task in topological_order(template["dag"]["tasks"], where):
        name = task["name"]
        task_where = f"{where}[{name}]"
        if stopped:
            results[name] = NodeResult(name, task["template"], OMITTED)
            continue
        scope = {**run.scope(), **task_scope(results)}
        if "when" in task and not when_holds(
            substitute(task["when"], scope, task_where), task_where
        ):
            results[name] = NodeResult(name, task["template"], SKIPPED)
            continue
        node = run_task(run, task, scope, artifacts, prefix + name, task_where)
        results[name] = node
        artifacts.update(
            {f"tasks.{name}.outputs.artifacts.{a}": p for a, p in node.artifacts.items()}
        )
        stopped = node.phase in (FAILED, ERROR)
    return results


def task_scope(results: dict[str, NodeResult]) -> dict[str, str]:
    """``tasks.T.outputs.parameters.P`` of the tasks finished so far."""
    return {
        f"tasks.{name}.outputs.parameters.{param}": value
        for name, node in results.items()
        for param, value in node.outputs.items()
    }


def dag_phase(nodes: dict[str, NodeResult]) -> str:
    """Failed/Error as the first task that failed, else Succeeded (Skipped tasks are fine)."""
    for node in nodes.values():
        if node.phase in (FAILED, ERROR):
            return node.phase
    return SUCCEEDED


def run_task(
    run: _Run,
    task: dict[str, Any],
    scope: dict[str, str],
    artifacts: dict[str, Path],
    node: str,
    where: str,
) -> NodeResult:
    template = run.templates.get(task["template"])
    if template is None:
        raise ArgoWorkflowError(f"{where}: no template named {task['template']!r}")
    if "container" not in template:
        raise UnsupportedArgoFeature(f"{where}.template", "a nested dag")
    arguments = task.get("arguments", {})
    parameters = {
        p["name"]: substitute(p.get("value", ""), scope, f"{where}.arguments")
        for p in arguments.get("parameters", [])
    }
    given_artifacts = {}
    for artifact in arguments.get("artifacts", []):
        key = VARIABLE.fullmatch(str(artifact.get("from", "")).strip())
        if key is None or key.group(1).strip() not in artifacts:
            raise UnsupportedArgoFeature(
                f"{where}.arguments.artifacts[{artifact['name']}].from",
                f"only an earlier task's output artifact: {artifact.get('from')!r}",
            )
        given_artifacts[artifact["name"]] = artifacts[key.group(1).strip()]
    return ContainerNode(run, template, node, task["name"]).execute(parameters, given_artifacts)


# --- container nodes -------------------------------------------------------------------------


@dataclass
class PathMap:
    """Container path prefixes and the host folders they stand for."""

    roots: dict[str, Path]
    workdir: Path

    def host(self, value: str) -> str:
        """``value`` with its longest mapped prefix replaced; host paths under the workdir
        (e.g. a previous step's output parameter) are left as they are."""
        if value.startswith(f"{self.workdir}/") or value == str(self.workdir):
            return value
        matches = [root for root in self.roots if value == root or value.startswith(root + "/")]
        if not matches:
            return value
        root = max(matches, key=len)
        return str(self.roots[root]) + value[len(root) :]


class ContainerNode:
    """One task running a container template: inputs staged, process run (with retries),
    outputs collected."""

    def __init__(self, run: _Run, template: dict[str, Any], node: str, task: str) -> None:
        self.run, self.template, self.node, self.task = run, template, node, task
        self.where = f"spec.templates[{template['name']}]"
        self.dir = run.workdir / "nodes" / node
        self.fs = self.dir / "fs"
        self.log_path = self.dir / "main.log"

    def execute(self, parameters: dict[str, str], artifacts: dict[str, Path]) -> NodeResult:
        inputs = self.template.get("inputs", {})
        scope = {**self.run.scope(), **self.input_parameters(parameters)}
        for name in set(artifacts) - {a["name"] for a in inputs.get("artifacts", [])}:
            raise ArgoWorkflowError(f"{self.where}: no input artifact named {name!r}")
        outputs = self.template.get("outputs", {})
        input_paths = {
            a["name"]: self.container_path(a, scope) for a in inputs.get("artifacts", [])
        }
        output_params = {
            p["name"]: self.container_path(p["valueFrom"], scope)
            for p in outputs.get("parameters", [])
        }
        output_artifacts = {
            a["name"]: self.container_path(a, scope) for a in outputs.get("artifacts", [])
        }
        paths = self.path_map(
            [*input_paths.values()], [*output_params.values(), *output_artifacts.values()]
        )
        container = self.template["container"]
        argv = [
            paths.host(substitute(arg, scope, f"{self.where}.container"))
            for arg in [*container.get("command", []), *container.get("args", [])]
        ]
        if not argv:
            raise UnsupportedArgoFeature(f"{self.where}.container", "no command: image entrypoint")
        host_env = {
            key: value for key, value in os.environ.items() if not key.startswith(POD_IDENTITY)
        }
        base_env = {**host_env, **self.run.env}

        if self.dir.exists():
            shutil.rmtree(self.dir)
        (self.dir / "work").mkdir(parents=True)
        limit, retried, expression = self.retry_strategy()
        result = NodeResult(self.task, self.template["name"], ERROR)
        for attempt in range(1, limit + 2):
            result.attempts, result.outputs, result.artifacts = attempt, {}, {}
            self.reset_fs()
            for name, path in input_paths.items():
                copy(artifacts[name], Path(paths.host(path)))
            started = time.monotonic()
            pod = self.start_pod(self.node_name(attempt, "retryStrategy" in self.template))
            env = {**base_env, **self.container_env(container, paths, scope, pod)}
            result.phase, result.exit_code = self.attempt(argv, env, attempt)
            self.end_pod(pod, result.phase)
            if result.phase == SUCCEEDED:
                result.phase = self.collect(result, paths, output_params, output_artifacts)
            if result.phase == SUCCEEDED or result.phase not in retried:
                break
            if expression and not self.expression_allows_retry(
                expression, result, time.monotonic() - started
            ):
                break
            time.sleep(RETRY_PAUSE_SECONDS)
        result.log = self.log_path.read_text(errors="replace")
        return result

    def node_name(self, attempt: int, retried: bool) -> str:
        """Argo's node name of the attempt: ``<workflow>.<task path>``, ``(n)`` per retry."""
        name = f"{self.run.name}.{self.node}"
        return f"{name}({attempt - 1})" if retried else name

    def start_pod(self, node_name: str) -> dict[str, Any]:
        """The attempt's pod: named and owned as Argo's controller does; in the emulator when
        the run has one (Running), else only its metadata."""
        digest = fnv32a(node_name)
        metadata: dict[str, Any] = {
            "name": f"{self.run.name}-{self.template['name']}-{digest}",
            "namespace": self.run.namespace,
            "labels": {WORKFLOW_LABEL: self.run.name},
            "annotations": {"workflows.argoproj.io/node-name": node_name},
            "uid": "",
        }
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": metadata,
            "spec": {"containers": [{"name": "main", "image": "local"}]},
            "node_id": f"{self.run.name}-{digest}",
        }
        if self.run.emulator is None or self.run.workflow is None:
            return pod
        workflow = self.run.workflow["metadata"]
        metadata["ownerReferences"] = [
            {
                "apiVersion": "argoproj.io/v1alpha1",
                "kind": "Workflow",
                "name": workflow["name"],
                "uid": workflow["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        del metadata["uid"]
        body = {key: value for key, value in pod.items() if key != "node_id"}
        body["status"] = {"phase": "Running"}
        created = self.run.emulator.create("pods", body, self.run.namespace)
        return {**created, "node_id": pod["node_id"]}

    def end_pod(self, pod: dict[str, Any], phase: str) -> None:
        if self.run.emulator is not None and pod["metadata"].get("uid"):
            ended = "Succeeded" if phase == SUCCEEDED else "Failed"
            self.run.emulator.set_pod_status(
                pod["metadata"]["name"], {"phase": ended}, pod["metadata"]["namespace"]
            )

    def container_env(
        self, container: dict[str, Any], paths: PathMap, scope: dict[str, str], pod: dict[str, Any]
    ) -> dict[str, str]:
        """The template's env, then what Argo's controller appends to the main container."""
        env: dict[str, str] = {}
        scope = {**scope, "pod.name": pod["metadata"]["name"]}  # Argo's {{pod.name}}
        for var in container.get("env", []):
            if "valueFrom" in var:
                env[var["name"]] = field_ref(pod, var["valueFrom"]["fieldRef"]["fieldPath"])
            else:
                env[var["name"]] = paths.host(substitute(var.get("value", ""), scope, self.where))
        env.update(
            ARGO_CONTAINER_NAME="main",
            ARGO_NODE_ID=pod["node_id"],
            ARGO_INCLUDE_SCRIPT_OUTPUT="false",
            ARGO_DEADLINE=NO_DEADLINE,
            ARGO_WORKFLOW_NAME=self.run.name,
        )
        return env

    def input_parameters(self, given: dict[str, str]) -> dict[str, str]:
        """``inputs.parameters.*``: the task's arguments, else the declared defaults."""
        declared = self.template.get("inputs", {}).get("parameters", [])
        unknown = set(given) - {p["name"] for p in declared}
        if unknown:
            raise ArgoWorkflowError(f"{self.where} has no input parameter(s) {sorted(unknown)}")
        values = {}
        for parameter in declared:
            name = parameter["name"]
            if name in given:
                values[name] = given[name]
            elif "default" in parameter:
                values[name] = substitute(parameter["default"], self.run.scope(), self.where)
            else:
                raise ArgoWorkflowError(
                    f"task {self.task}: input parameter {name!r} of {self.where} not supplied"
                )
        return {f"inputs.parameters.{name}": value for name, value in values.items()}

    def container_path(self, holder: dict[str, Any], scope: dict[str, str]) -> str:
        path = substitute(holder["path"], scope, f"{self.where} path").rstrip("/")
        if not path.startswith("/"):
            raise ArgoWorkflowError(f"{self.where}: path {path!r} is not absolute")
        return path

    def path_map(self, inputs: list[str], outputs: list[str]) -> PathMap:
        """Mounts map to their claim's folder; other input/output paths (and the outputs'
        parent folders) to this node's private ``fs`` folder."""
        roots: dict[str, Path] = {}
        for mount in self.template["container"].get("volumeMounts", []):
            if mount["name"] not in self.run.volumes:
                raise ArgoWorkflowError(f"{self.where}: no volume named {mount['name']!r}")
            roots[str(mount["mountPath"]).rstrip("/")] = self.run.volumes[mount["name"]]
        mounts = list(roots)
        parents = [os.path.dirname(path) for path in outputs]
        for path in [*inputs, *outputs, *parents]:
            on_mount = any(path == m or path.startswith(m + "/") for m in mounts)
            if path not in ("", "/") and not on_mount:
                roots[path] = self.fs / path.lstrip("/")
        return PathMap(roots, self.run.workdir)

    def expression_allows_retry(self, expression: str, result: NodeResult, seconds: float) -> bool:
        """``retryStrategy.expression`` after a failed attempt, with Argo's ``lastRetry.*``
        variables (strings; exitCode "-1" when the attempt has none)."""
        variables = {
            "lastRetry.exitCode": str(result.exit_code if result.exit_code is not None else -1),
            "lastRetry.status": result.phase,
            "lastRetry.duration": str(int(seconds)),
            "lastRetry.message": "",
        }
        try:
            allowed = evaluate_bool(expression, variables)
        except UnsupportedExpression as error:
            raise UnsupportedArgoFeature(
                f"{self.where}.retryStrategy.expression", str(error)
            ) from None
        if not allowed:
            with open(self.log_path, "a") as log:
                log.write("--- retryStrategy.expression evaluated to false\n")
        return allowed

    def retry_strategy(self) -> tuple[int, set[str], str]:
        """(retries allowed, attempt phases that are retried, the retry expression or "")."""
        strategy = self.template.get("retryStrategy")
        if strategy is None:
            return 0, set(), ""
        expression = str(strategy.get("expression") or "")
        try:
            limit = int(str(strategy.get("limit", 0)))
        except ValueError:
            raise UnsupportedArgoFeature(
                f"{self.where}.retryStrategy.limit", repr(strategy["limit"])
            ) from None
        default = DEFAULT_RETRY_POLICY_WITH_EXPRESSION if expression else DEFAULT_RETRY_POLICY
        policy = strategy.get("retryPolicy", default)
        if policy not in RETRY_POLICIES:
            raise UnsupportedArgoFeature(f"{self.where}.retryStrategy.retryPolicy", repr(policy))
        return limit, RETRY_POLICIES[policy], expression

    def reset_fs(self) -> None:
        """A fresh container filesystem per attempt, as a retried pod gets."""
        if self.fs.exists():
            shutil.rmtree(self.fs)
        (self.fs / "tmp").mkdir(parents=True)

    def attempt(self, argv: list[str], env: dict[str, str], attempt: int) -> tuple[str, int | None]:
        """Run the process once (no shell), its output appended to the node's log; its own
        session, so a timeout kills what it started too."""
        with open(self.log_path, "ab") as log:
            log.write(f"--- attempt {attempt}: {argv}\n".encode())
            log.flush()
            try:
                process = subprocess.Popen(
                    argv,
                    cwd=self.dir / "work",
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as error:
                log.write(f"--- cannot start: {error}\n".encode())
                return ERROR, None
            try:
                code = process.wait(timeout=self.run.task_timeout)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                log.write(f"--- killed after {self.run.task_timeout:g}s\n".encode())
                return FAILED, None
        return (SUCCEEDED if code == 0 else FAILED), code

    def collect(
        self,
        result: NodeResult,
        paths: PathMap,
        parameters: dict[str, str],
        artifacts: dict[str, str],
    ) -> str:
        """Read output parameters and store output artifacts; a missing one is an Error."""
        for name, path in parameters.items():
            try:
                result.outputs[name] = Path(paths.host(path)).read_text().rstrip("\n")
            except OSError as error:
                return self.collect_error(f"output parameter {name}: {error}")
        for name, path in artifacts.items():
            stored = self.run.workdir / "artifacts" / self.node / name
            try:
                copy(Path(paths.host(path)), stored)
            except OSError as error:
                return self.collect_error(f"output artifact {name}: {error}")
            result.artifacts[name] = stored
        return SUCCEEDED

    def collect_error(self, message: str) -> str:
        with open(self.log_path, "a") as log:
            log.write(f"--- {message}\n")
        return ERROR


def fnv32a(text: str) -> int:
    """Go's ``hash/fnv`` New32a sum, as Argo hashes node names."""
    digest = 0x811C9DC5
    for byte in text.encode():
        digest = ((digest ^ byte) * 0x01000193) & 0xFFFFFFFF
    return digest


def field_ref(pod: dict[str, Any], path: str) -> str:
    """A downward-API ``fieldRef`` the way the kubelet resolves it for ``pod``."""
    meta = pod["metadata"]
    values = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
    }
    if path not in values:
        raise UnsupportedArgoFeature("env.valueFrom.fieldRef", f"fieldPath {path!r}")
    return values[path]


def copy(source: Path, target: Path) -> None:
    """Copy a file or folder to ``target``, replacing what is there."""
    if not source.exists():
        raise FileNotFoundError(f"{source} does not exist")
    if target.is_dir():
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        shutil.copytree(source, target)
    else:
        shutil.copy2(source, target)
