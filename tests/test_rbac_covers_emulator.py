"""The packaged RBAC (`kubetrain render rbac`, kubetrain/render/manifests) is least
privilege, checked both ways against the requests the CLI really sends (issue 14, item 9;
issue 17, item 12).

The trainer, job and pytorchjob backends run through `kubetrain launch|wait|logs|delete`
against the emulated API server, with the fake Trainer (or Training Operator) running the jobs,
plus the paths a run takes less often (a runtime that does not exist, a node that cannot start,
``--on-cancel suspend`` on every backend, a launch from a KFP step and from an Argo step with
only the env those systems give it, which looks up the run that owns the job). Every HTTP
request is turned into its RBAC verb and resource from its method and URL alone (as the API
server's request-info resolver does, not from the emulator's own log), and each must be
granted by a rule bound to the ``kubetrain`` ServiceAccount; and every verb the RBAC grants
must be one of those requests, or be listed here with the reason it is needed anyway.
(`tests/test_permissions.py` keeps `kubetrain doctor`'s list equal to the RBAC; neither of
them says what the steps really use.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kmock import resource

from kubetrain.cli import main as kubetrain_main
from kubetrain.render.manifests import rbac_manifests
from tests.support import KubeEmulator, objects
from tests.support.fake_kuberay import FakeKubeRay
from tests.support.fake_trainer import FakeTrainer
from tests.support.fake_training_operator import FakeTrainingOperator, defaulted, operator_pod
from tests.support.kube_api import ClusterAPI
from tests.test_rayjob import rayjob_submitter_pod

NAMESPACE = "default"
SERVICE_ACCOUNT = {"kind": "ServiceAccount", "name": "kubetrain", "namespace": NAMESPACE}
BACKENDS = ("trainer", "job", "pytorchjob", "rayjob")
JOB_PLURALS = {"trainer": "trainjobs", "job": "jobs", "pytorchjob": "pytorchjobs",
               "rayjob": resource("ray.io", "v1", "rayjobs")}  # fmt: skip
#: The API server's strconv.ParseBool, which decides whether a GET is a watch.
TRUE = {"1", "t", "T", "true", "TRUE", "True"}
METHOD_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch"}

#: Granted, though no CLI request uses it: (apiGroup, resource, verb) -> why.
JUSTIFIED = {
    ("argoproj.io", "workflowtaskresults", "create"): "Argo's executor in each step's pod "
    "(running as this ServiceAccount) reports the step's outputs with it, not the CLI",
    ("argoproj.io", "workflowtaskresults", "patch"): "the same, as the executor updates them",
}
#: Granted, used by nothing (strict xfails until rbac.yaml drops the verb): none now.
UNNEEDED: dict[tuple[str, str, str], str] = {}


# ------------------------------------------------------------------ requests in RBAC terms
@dataclass(frozen=True)
class Use:
    """One request as RBAC sees it; ``resource`` carries its subresource (``pods/log``)."""

    verb: str
    group: str
    resource: str
    namespace: str | None
    name: str | None


def use_of(method: str, path: str, params: Mapping[str, str]) -> Use:
    """The RBAC verb and resource of an HTTP request, from its method and URL alone."""
    parts = path.strip("/").split("/")
    if parts[0] == "api" and len(parts) > 2:
        group, rest = "", parts[2:]
    elif parts[0] == "apis" and len(parts) > 3:
        group, rest = parts[1], parts[3:]
    else:
        raise AssertionError(f"{method} {path} is not a resource request: rbac.yaml grants none")
    namespace = None
    if rest[0] == "namespaces" and len(rest) > 2:
        namespace, rest = rest[1], rest[2:]
    resource, name = rest[0], rest[1] if len(rest) > 1 else None
    if len(rest) > 2:
        resource = f"{resource}/{rest[2]}"
    if method == "GET":
        verb = "watch" if params.get("watch") in TRUE else "get" if name else "list"
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = METHOD_VERBS[method]
    return Use(verb, group, resource, namespace, name)


# ----------------------------------------------------------------------------- rbac.yaml
@dataclass(frozen=True)
class Rule:
    """A rule of a role bound to our ServiceAccount, in ``namespace`` (None: cluster-wide)."""

    namespace: str | None
    groups: frozenset[str]
    resources: frozenset[str]
    verbs: frozenset[str]
    names: frozenset[str]

    def grants(self, use: Use) -> bool:
        return (
            (self.namespace is None or self.namespace == use.namespace)
            and use.group in self.groups
            and use.resource in self.resources
            and use.verb in self.verbs
            and (not self.names or use.name in self.names)
        )


def bound_rules(
    documents: list[dict[str, Any]], subject: Mapping[str, str] = SERVICE_ACCOUNT
) -> list[Rule]:
    """The rules that apply to ServiceAccount ``subject``: a RoleBinding's in its namespace, a
    ClusterRoleBinding's everywhere; a role nothing binds to it grants nothing."""
    roles = {
        (d["kind"], d["metadata"]["name"], d["metadata"].get("namespace")): d["rules"]
        for d in documents
        if d["kind"] in ("Role", "ClusterRole")
    }
    rules = []
    for binding in documents:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        subjects = [{k: s.get(k) for k in SERVICE_ACCOUNT} for s in binding["subjects"]]
        if dict(subject) not in subjects:
            continue
        scope = binding["metadata"].get("namespace")  # None for a ClusterRoleBinding
        ref = binding["roleRef"]
        role_namespace = scope if ref["kind"] == "Role" else None
        for rule in roles.get((ref["kind"], ref["name"], role_namespace), []):
            rules.append(
                Rule(
                    scope,
                    frozenset(rule["apiGroups"]),
                    frozenset(rule["resources"]),
                    frozenset(rule["verbs"]),
                    frozenset(rule.get("resourceNames", ())),
                )
            )
    return rules


def rbac_documents() -> list[dict[str, Any]]:
    """What `kubetrain render rbac --namespace default` prints (the packaged RBAC)."""
    return rbac_manifests(NAMESPACE)


def grants_of(rules: list[Rule]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule.groups
        for resource in rule.resources
        for verb in rule.verbs
    }


RULES = bound_rules(rbac_documents())


# ------------------------------------------------------------------------- the scenarios
@dataclass
class Run:
    """The emulated cluster a scenario runs on, and the folder it may write in."""

    emulator: KubeEmulator
    backend: str
    tmp: Path

    def cli(self, *argv: str, code: int = 0) -> None:
        assert kubetrain_main(list(argv)) == code, argv

    def node_pod(self, job: str, waiting: str) -> None:
        """Node 0 of ``job``, stuck in state ``waiting``, with an event saying why."""
        owner = self.emulator.get(JOB_PLURALS[self.backend], job)
        if self.backend == "pytorchjob":
            pod, container = operator_pod(defaulted(owner), "Master", 0), "pytorch"
        elif self.backend == "rayjob":
            pod, container = rayjob_submitter_pod(owner), "ray-job-submitter"
        else:
            pod = objects.node_pod(job, 0, kind=self.backend, image="img:1", owner=owner)
            container = objects.NODE_CONTAINER
        name = self.emulator.create_pod(pod)["metadata"]["name"]
        status = objects.container_status("img:1", objects.waiting(waiting), name=container)
        self.emulator.set_pod_status(name, objects.pod_status("Pending", [status]))
        self.emulator.add_event(self.emulator.get("pods", name), "Failed", "bad image name")

    def launch(self, job: str, *options: str) -> None:
        self.cli("launch", "--backend", self.backend, "--name", job, "--nodes", "1", *options,
                 "--", "python", "-c", "print('node')")  # fmt: skip


#: What each node runs: the fake Trainer mounts no ConfigMap, so it names the shipped script
#: (as launch requires) without running it.
SHOW_SCRIPT = "import sys; print('node would run', sys.argv[1])"


def the_full_flow(run: Run) -> None:
    """launch (with a shipped script) -> wait -> logs -> delete, the job run by the fake
    Trainer, Job controller, Training Operator or KubeRay with real processes. A RayJob has one
    node (its driver's log; a Ray cluster of one worker here) and its driver runs in its
    checkpoint folder, made on this machine: one in the test's folder."""
    backend, job = run.backend, f"flow-{run.backend}"
    script = run.tmp / "train.py"
    script.write_text("print('shipped')\n")
    ray = backend == "rayjob"
    nodes, followed = ("1", "0") if ray else ("2", "1")
    where = ["--checkpoint-dir", str(run.tmp / "checkpoints")] if ray else []
    fakes = {"pytorchjob": FakeTrainingOperator, "rayjob": FakeKubeRay}
    with fakes.get(backend, FakeTrainer)(run.emulator, run.tmp / "nodes") as trainer:
        run.cli("launch", "--backend", backend, "--name", job, "--nodes", nodes, *where,
                "--script", str(script), "--", "python", "-c", SHOW_SCRIPT, "train.py")  # fmt: skip
        run.cli("wait", "--backend", backend, job)
        run.cli("logs", "--backend", backend, job)
        run.cli("logs", "--backend", backend, "--node", followed, "--follow", job)
        run.cli("delete", "--backend", backend, job)
    assert trainer.errors == []
    run.cli("delete", "--backend", backend, "--ignore-not-found", job)


def a_node_that_cannot_start(run: Run) -> None:
    """wait fails early, lists the pod's events and deletes the job (the default on-cancel)."""
    job = f"early-{run.backend}"
    run.launch(job)
    run.node_pod(job, "InvalidImageName")
    run.cli("wait", "--backend", run.backend, job, code=1)
    assert run.emulator.get(JOB_PLURALS[run.backend], job) is None


def suspend_on_cancel(run: Run) -> None:
    """The same with --on-cancel suspend: the job is patched suspended, then deleted."""
    job = f"suspend-{run.backend}"
    run.launch(job)
    run.node_pod(job, "InvalidImageName")
    run.cli("wait", "--backend", run.backend, "--on-cancel", "suspend", job, code=1)
    spec = run.emulator.get(JOB_PLURALS[run.backend], job)["spec"]
    assert (spec.get("runPolicy") or spec)["suspend"] is True
    run.cli("delete", "--backend", run.backend, job)


def runtimes_that_do_not_exist(run: Run) -> None:
    """A missing runtime of either kind is refused, listing the runtimes there are."""
    for kind in ("ClusterTrainingRuntime", "TrainingRuntime"):
        run.cli("launch", "--backend", "trainer", "--name", "no-runtime", "--runtime", "nope",
                "--runtime-kind", kind, "--", "python", "-c", "1", code=2)  # fmt: skip


def a_namespaced_runtime(run: Run) -> None:
    run.emulator.create("trainingruntimes", objects.torch_runtime("team", namespace=NAMESPACE))
    run.launch("namespaced", "--runtime", "team", "--runtime-kind", "TrainingRuntime")
    run.cli("delete", "--backend", "trainer", "namespaced")


def workflow_object(name: str) -> dict[str, Any]:
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "metadata": {"name": name}}


def launch_with_env(env: dict[str, str], launch: Callable[[], None]) -> None:
    """``launch`` with only ``env`` saying where it runs (no KUBETRAIN_OWNER_* override)."""
    with pytest.MonkeyPatch.context() as patch:
        for name in (
            "KUBETRAIN_OWNER_NAME",
            "KUBETRAIN_OWNER_UID",
            "KUBETRAIN_OWNER_POD",
            "KUBETRAIN_OWNER_POD_NAMESPACE",
            "POD_NAME",
            "POD_NAMESPACE",
        ):
            patch.delenv(name, raising=False)
        for name, value in env.items():
            patch.setenv(name, value)
        launch()


def owner_names(run: Run, job: str) -> list[str]:
    return [o["name"] for o in run.emulator.get("trainjobs", job)["metadata"]["ownerReferences"]]


def from_a_kfp_step(run: Run) -> None:
    """A KFP launch step: KFP gives the step container KFP_POD_NAME/KFP_POD_UID (kubeflow/
    pipelines 2.17.0 backend/src/v2/compiler/argocompiler/common.go); launch GETs its own pod,
    whose Workflow ownerReference (a KFP run is an Argo Workflow) owns the TrainJob."""
    run.emulator.install_crd(objects.workflow_crd())
    workflow = run.emulator.create("workflows", workflow_object("kfp-run"))
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "kfp-run-launch-1", "namespace": NAMESPACE,
                        "ownerReferences": [objects.owner_reference(workflow)]},
           "spec": {"containers": [{"name": "main", "image": "img:1"}]}}  # fmt: skip
    pod = run.emulator.create_pod(pod)
    env = {"KFP_POD_NAME": pod["metadata"]["name"], "KFP_POD_UID": pod["metadata"]["uid"]}
    launch_with_env(env, lambda: run.launch("kfp-owned"))
    assert owner_names(run, "kfp-owned") == ["kfp-run"]


def from_an_argo_step(run: Run) -> None:
    """An Argo launch step: its main container has ARGO_WORKFLOW_NAME (argo-workflows
    workflow/controller/workflowpod.go), not the uid; launch GETs the Workflow by name."""
    run.emulator.install_crd(objects.workflow_crd())
    run.emulator.create("workflows", workflow_object("argo-run"))
    env = {"ARGO_WORKFLOW_NAME": "argo-run", "ARGO_NODE_ID": "argo-run-1234"}
    launch_with_env(env, lambda: run.launch("argo-owned"))
    assert owner_names(run, "argo-owned") == ["argo-run"]


SCENARIOS: dict[str, Callable[[Run], None]] = {
    "full-flow": the_full_flow,
    "node-cannot-start": a_node_that_cannot_start,
    "suspend-on-cancel": suspend_on_cancel,
    "missing-runtimes": runtimes_that_do_not_exist,
    "namespaced-runtime": a_namespaced_runtime,
    "from-a-kfp-step": from_a_kfp_step,
    "from-an-argo-step": from_an_argo_step,
}
#: Runtimes are the Trainer's; the owner is found by the same code for every backend.
TRAINER_ONLY = {"missing-runtimes", "namespaced-runtime", "from-a-kfp-step",
                "from-an-argo-step"}  # fmt: skip
CASES = [(b, s) for b in BACKENDS for s in SCENARIOS if b == "trainer" or s not in TRAINER_ONLY]
#: A RayJob's full flow trains on a real Ray cluster: tests/test_rayjob_e2e.py runs it once and
#: checks its requests against rbac.yaml there (``requests_sent``, ``ungranted``), not again here.
CASES.remove(("rayjob", "full-flow"))
#: Requests rbac.yaml does not grant (real gaps), as strict xfails: none now.
GAPS: dict[tuple[str, str], str] = {}


def grant_id(grant: tuple[str, str, str]) -> str:
    group, resource, verb = grant
    return f"{verb} {resource}" + (f".{group}" if group else "")


def gap_marks(reason: str | None) -> list[pytest.MarkDecorator]:
    """A known gap fails as a strict xfail: once fixed, the XPASS says to drop it from here."""
    return [pytest.mark.xfail(strict=True, reason=reason)] if reason else []


@contextlib.contextmanager
def requests_sent() -> Iterator[list[tuple[str, str, dict[str, str]]]]:
    """Every HTTP request the emulated API servers answer meanwhile: (method, path, query).
    The fakes and the emulator's own methods call the server's logic directly, unrecorded."""
    seen: list[tuple[str, str, dict[str, str]]] = []
    handle = ClusterAPI._handle

    async def recording(self: ClusterAPI, request: Any) -> Any:
        seen.append((request.method.value.upper(), request.url.path, dict(request.params)))
        return await handle(self, request)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ClusterAPI, "_handle", recording)
        yield seen


def ungranted(requests: list[tuple[str, str, dict[str, str]]]) -> list[Use]:
    """The requests no rule bound to the ``kubetrain`` ServiceAccount grants."""
    uses = {use_of(*request) for request in requests}
    return sorted((u for u in uses if not any(rule.grants(u) for rule in RULES)), key=str)


@pytest.fixture(scope="module")
def uses(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[tuple[str, str], list[Use]]]:
    """Every scenario of every backend, each on a fresh emulated cluster: its requests."""
    found = {}
    with requests_sent() as seen, pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        for backend, scenario in CASES:
            tmp = tmp_path_factory.mktemp(f"{backend}-{scenario}")
            with KubeEmulator(namespace=NAMESPACE) as emulator:
                emulator.install_trainer()
                if backend == "pytorchjob":
                    emulator.install_training_operator()
                if backend == "rayjob":
                    emulator.install_kuberay()
                patch.setenv("KUBECONFIG", str(emulator.write_kubeconfig(tmp / "kubeconfig")))
                del seen[:]
                SCENARIOS[scenario](Run(emulator, backend, tmp))
                found[backend, scenario] = [use_of(*request) for request in seen]
    yield found


@pytest.mark.parametrize(
    ("backend", "scenario"),
    [pytest.param(*case, marks=gap_marks(GAPS.get(case)), id="-".join(case)) for case in CASES],
)
def test_every_request_is_granted_by_rbac(
    uses: dict[tuple[str, str], list[Use]], backend: str, scenario: str
) -> None:
    requests = uses[backend, scenario]
    assert requests, "the scenario sent no request"
    refused = sorted({u for u in requests if not any(rule.grants(u) for rule in RULES)}, key=str)
    assert refused == [], "rbac.yaml does not grant:\n" + "\n".join(map(str, refused))


@pytest.mark.parametrize(
    "grant",
    [
        pytest.param(grant, marks=gap_marks(UNNEEDED.get(grant)), id=grant_id(grant))
        for grant in sorted(grants_of(RULES))
    ],
)
def test_every_grant_is_used_or_justified(
    uses: dict[tuple[str, str], list[Use]], grant: tuple[str, str, str]
) -> None:
    used = {(u.group, u.resource, u.verb) for requests in uses.values() for u in requests}
    assert grant in used or grant in JUSTIFIED, f"rbac.yaml grants {grant}, which nothing uses"


def test_the_lists_here_name_only_what_rbac_grants() -> None:
    """So a verb dropped from rbac.yaml is dropped here too, and no reason outlives its grant."""
    assert set(JUSTIFIED) | set(UNNEEDED) <= grants_of(RULES)
    assert not set(JUSTIFIED) & set(UNNEEDED)


# --------------------------------------------------------------- the checker's own checks
@pytest.mark.parametrize(
    ("method", "path", "params", "expected"),
    [
        ("GET", "/api/v1/namespaces/ns/pods", {}, Use("list", "", "pods", "ns", None)),
        ("GET", "/api/v1/namespaces/ns/pods", {"watch": "True"},
         Use("watch", "", "pods", "ns", None)),
        ("GET", "/api/v1/namespaces/ns/pods/p/log", {"follow": "true"},
         Use("get", "", "pods/log", "ns", "p")),
        ("POST", "/apis/batch/v1/namespaces/ns/jobs", {},
         Use("create", "batch", "jobs", "ns", None)),
        ("PUT", "/apis/batch/v1/namespaces/ns/jobs/j", {},
         Use("update", "batch", "jobs", "ns", "j")),
        ("PATCH", "/apis/batch/v1/namespaces/ns/jobs/j/status", {},
         Use("patch", "batch", "jobs/status", "ns", "j")),
        ("DELETE", "/api/v1/namespaces/ns/pods", {},
         Use("deletecollection", "", "pods", "ns", None)),
        ("GET", "/apis/x.io/v1/things/t", {}, Use("get", "x.io", "things", None, "t")),
    ],
)  # fmt: skip
def test_requests_map_to_rbac_verbs(
    method: str, path: str, params: dict[str, str], expected: Use
) -> None:
    assert use_of(method, path, params) == expected


def test_the_checker_refuses_what_no_bound_rule_grants() -> None:
    granted = Use("get", "", "pods/log", NAMESPACE, "p")
    assert any(rule.grants(granted) for rule in RULES)
    refused = [
        Use("get", "", "pods/log", "team-a", "p"),  # the Role is bound in default only
        Use("create", "", "pods", NAMESPACE, None),  # a verb not granted
        Use("get", "", "secrets", NAMESPACE, "s"),  # a resource not granted
        Use("get", "apiextensions.k8s.io", "customresourcedefinitions", None, "other.io"),
    ]
    for use in refused:
        assert not any(rule.grants(use) for rule in RULES), use
    unbound = [d for d in rbac_documents() if d["kind"] != "RoleBinding"]
    assert not any(rule.grants(granted) for rule in bound_rules(unbound)), "unbound Role"
