"""The rules a value must follow before it reaches a cluster or a node: one function per rule,
shared by `launch`, `render` and `submit kfp|argo`, so a value is refused the same way by each.

Each rule takes the value and the ``field`` to name, returns the value when it is valid and
raises ``InvalidInput(field, problem, fix)`` otherwise (``fix`` overrides the rule's own).
Kubernetes' rules are written after k8s.io/apimachinery/pkg/util/validation/validation.go
(IsDNS1123Label, IsDNS1123Subdomain, IsDNS1035Label, IsQualifiedName, IsValidLabelValue,
IsEnvVarName, IsConfigMapKey) and pkg/api/resource/quantity.go (parseQuantityString); image
references after the grammar of github.com/distribution/reference (regexp.go). Patterns are
applied with ``fullmatch``: ``re.match`` with ``$`` lets a trailing newline through.

Imported by ``kubetrain --help`` (through ``kubetrain.cli.param_option``): nothing heavy at the top.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection
from typing import TypeVar

from kubetrain.errors import InvalidInput

#: What a training run may choose, importable without torch: the CLI (`kubetrain --help`),
#: launch and the pipeline-parameter checks refuse a bad choice before anything starts.
STRATEGIES = ("ddp", "fsdp", "deepspeed")
STRATEGY_FIX = "use ddp, fsdp or deepspeed"
#: DeepSpeed's ZeRO stages (``zero_optimization.stage``) our trainer runs; 0 is plain DDP.
ZERO_STAGES = (1, 2, 3)
DEFAULT_ZERO_STAGE = 2
#: What starts a job's processes on each node: torchrun (the PET_* env), mpirun from a
#: launcher, as Kubeflow Trainer's MPI policy (the ``deepspeed-distributed`` runtime) runs it,
#: or Ray: the command is a Ray job's entrypoint, whose Ray Train workers run on the Ray
#: cluster's worker nodes (a KubeRay RayJob, or the local backend's Ray on this machine).
LAUNCHERS = ("torchrun", "mpi", "ray")
LAUNCHER_FIX = "use torchrun (the default), mpi or ray"
BUILTIN_MODELS = ("mlp", "cnn")
MODEL_FIX = "use mlp, cnn or package.module:callable"


def is_model_spec(spec: str) -> bool:
    """A built-in model, or a ``package.module:callable`` to import."""
    return spec in BUILTIN_MODELS or ":" in spec


T = TypeVar("T")

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
#: Lengths validation.go allows.
DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253
QUALIFIED_NAME_MAX = 63
LABEL_VALUE_MAX = 63
CONFIG_MAP_KEY_MAX = 253
#: distribution/reference's NameTotalLengthMax (the name, without tag and digest).
IMAGE_NAME_MAX = 255
#: How much of a refused value an error line quotes.
SHOWN_MAX = 80

_DNS1123_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
DNS1123_LABEL = re.compile(_DNS1123_LABEL)
DNS1123_SUBDOMAIN = re.compile(rf"{_DNS1123_LABEL}(?:\.{_DNS1123_LABEL})*")
DNS1035_LABEL = re.compile(r"[a-z](?:[-a-z0-9]*[a-z0-9])?")
QUALIFIED_NAME = re.compile(r"(?:[A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
ENV_VAR_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
CONFIG_MAP_KEY = re.compile(r"[-._a-zA-Z0-9]+")
# quantity.go: <sign>?<digits>[.<digits>] then an exponent, a binary or a decimal SI suffix.
QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:[eE][-+]?[0-9]+|[KMGTPE]i|[numkMGTPE])?"
)
#: No quantity a pod asks for is longer; a longer text is refused before any parsing.
QUANTITY_MAX = 64

# distribution/reference: [host[:port]/]path[:tag][@digest], lowercase path components.
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
IMAGE_REFERENCE = re.compile(
    rf"(?P<name>(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?"
)


def shown(value: object) -> str:
    """``value`` quoted for an error line: escaped (a newline shows as ``\\n``) and short."""
    text = repr(value)
    return text if len(text) <= SHOWN_MAX else text[: SHOWN_MAX - 4] + "...'"


def _text(
    value: object, field: str, what: str, limit: int | None, pattern: re.Pattern[str], fix: str
) -> str:
    """``value`` when it is non-empty text matching ``pattern``, of at most ``limit`` characters."""
    if not isinstance(value, str):
        raise InvalidInput(field, f"{shown(value)} is not text", fix)
    if not value:
        raise InvalidInput(field, "is empty", fix)
    if limit is not None and len(value) > limit:
        raise InvalidInput(
            field, f"{shown(value)} is {len(value)} characters, more than {limit}", fix
        )
    if not pattern.fullmatch(value):
        raise InvalidInput(field, f"{shown(value)} is not {what}", fix)
    return value


def _fits(text: str, limit: int, pattern: re.Pattern[str]) -> bool:
    return 0 < len(text) <= limit and pattern.fullmatch(text) is not None


def dns1123_label(value: str, field: str, fix: str = "", what: str = "a DNS-1123 label") -> str:
    """A volume's name (IsDNS1123Label)."""
    fix = (
        fix or "use at most 63 lowercase letters, digits and '-', starting and ending alphanumeric"
    )
    return _text(value, field, what, DNS1123_LABEL_MAX, DNS1123_LABEL, fix)


def namespace(value: str, field: str, fix: str = "") -> str:
    """A namespace's name: a DNS-1123 label."""
    return dns1123_label(value, field, fix, "a namespace name")


def dns1123_subdomain(value: str, field: str, fix: str = "") -> str:
    """The name of most objects: a Secret, a PVC, a ServiceAccount, a runtime
    (IsDNS1123Subdomain)."""
    fix = fix or "use lowercase letters, digits, '-' and '.' (at most 253), e.g. my-secret"
    return _text(
        value, field, "a DNS-1123 subdomain", DNS1123_SUBDOMAIN_MAX, DNS1123_SUBDOMAIN, fix
    )


def dns1035_label(value: str, field: str, fix: str = "") -> str:
    """A name that becomes a DNS label starting with a letter: a job's (IsDNS1035Label)."""
    fix = fix or (
        "use at most 63 lowercase letters, digits and '-', starting with a letter and not "
        "ending in '-', e.g. mnist-ddp"
    )
    return _text(value, field, "an RFC 1035 label", DNS1123_LABEL_MAX, DNS1035_LABEL, fix)


def qualified_name(value: str, field: str, fix: str = "") -> str:
    """A label key, a node-selector key, a toleration key: NAME or PREFIX/NAME, PREFIX a DNS
    subdomain (IsQualifiedName)."""
    fix = fix or (
        "use NAME or PREFIX/NAME: NAME at most 63 letters, digits, '-', '_' or '.' starting and "
        "ending alphanumeric, PREFIX a DNS subdomain, e.g. example.com/team"
    )
    if not isinstance(value, str):
        raise InvalidInput(field, f"{shown(value)} is not text", fix)
    prefix, slash, name = value.rpartition("/")
    valid = _fits(name, QUALIFIED_NAME_MAX, QUALIFIED_NAME) and (
        not slash or _fits(prefix, DNS1123_SUBDOMAIN_MAX, DNS1123_SUBDOMAIN)
    )
    if not valid:
        raise InvalidInput(field, f"{shown(value)} is not a qualified name", fix)
    return value


def label_value(value: str, field: str, fix: str = "") -> str:
    """A label's or a node selector's value, a toleration's value: empty, or like a qualified
    name without prefix (IsValidLabelValue)."""
    fix = fix or "use at most 63 letters, digits, '-', '_' or '.', starting and ending alphanumeric"
    if value == "":
        return value
    return _text(value, field, "a label value", LABEL_VALUE_MAX, QUALIFIED_NAME, fix)


def env_var_name(value: str, field: str, fix: str = "") -> str:
    """An environment variable's name (IsEnvVarName)."""
    fix = fix or "use letters, digits, '_', '-' and '.', not starting with a digit"
    return _text(value, field, "an environment variable name", None, ENV_VAR_NAME, fix)


def config_map_key(value: str, field: str, fix: str = "") -> str:
    """A key of a ConfigMap's data (IsConfigMapKey)."""
    fix = fix or "use letters, digits, '-', '_' and '.' (at most 253), e.g. train.py"
    _text(value, field, "a ConfigMap key", CONFIG_MAP_KEY_MAX, CONFIG_MAP_KEY, fix)
    if value in (".", "..") or value.startswith(".."):
        raise InvalidInput(field, f"{shown(value)} is not a ConfigMap key", fix)
    return value


def quantity(value: str, field: str, fix: str = "") -> str:
    """A resource quantity ('2', '500m', '.5', '100u', '4Gi'), not negative, in the form
    quantity.go's parser accepts (a sign, digits with an optional fraction, then an exponent,
    a binary or a decimal SI suffix). A suffix only scales the number, so the sign and digits
    alone say whether it is negative: no Decimal parse, and no cluster client to import."""
    fix = fix or "write it like '2', '500m', '.5' or '4Gi'"
    problem = f"{shown(value)} is not a Kubernetes quantity"
    if not isinstance(value, str) or len(value) > QUANTITY_MAX:
        raise InvalidInput(field, problem, fix)
    parsed = QUANTITY.fullmatch(value)
    if parsed is None:
        raise InvalidInput(field, problem, fix)
    if parsed["sign"] == "-" and parsed["number"].strip("0.") != "":
        raise InvalidInput(field, f"{shown(value)} is negative", "use 0 or more, e.g. '500m'")
    return value


def image_reference(value: str, field: str, fix: str = "") -> str:
    """A container image, ``[host[:port]/]path[:tag][@digest]``, as the kubelet will pull it."""
    fix = fix or "use e.g. ghcr.io/org/trainer:1.0 (lowercase path, tag and/or @sha256:digest)"
    _text(value, field, "an image reference", None, IMAGE_REFERENCE, fix)
    name = IMAGE_REFERENCE.fullmatch(value)["name"]  # type: ignore[index]
    if len(name) > IMAGE_NAME_MAX:
        raise InvalidInput(
            field, f"the image name is {len(name)} characters, more than {IMAGE_NAME_MAX}", fix
        )
    return value


def whole_number(value: int, field: str, low: int, high: int = INT32_MAX, fix: str = "") -> int:
    """A count that lands in a Kubernetes object (int32 unless ``high`` says otherwise)."""
    fix = fix or f"use a whole number from {low} to {high}"
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidInput(field, f"{shown(value)} is not a whole number", fix)
    if value < low:
        raise InvalidInput(field, f"{value} is below {low}", fix)
    if value > high:
        raise InvalidInput(field, f"{value} is more than {high}", fix)
    return value


def positive_number(value: float, field: str, fix: str = "") -> float:
    """A finite number above 0 (a learning rate): NaN and infinity pass ``> 0`` checks or none."""
    fix = fix or "use a finite number above 0, e.g. 0.001"
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value <= 0:
        raise InvalidInput(field, f"{shown(value)} is not a finite number above 0", fix)
    return value


def one_of(value: T, field: str, choices: Collection[T], fix: str = "") -> T:
    """One of a fixed set of values, compared exactly (no stripping, no case folding)."""
    if value not in choices:
        fix = fix or f"use one of {', '.join(str(choice) for choice in choices)}"
        raise InvalidInput(field, f"{shown(value)} is unknown", fix)
    return value


def model_spec(value: str, field: str, fix: str = "") -> str:
    """A built-in model, or ``package.module:callable`` of dotted Python identifiers (it is
    imported only where it will run)."""
    module, sep, attribute = value.partition(":") if isinstance(value, str) else ("", "", "")
    dotted = f"{module}.{attribute}".split(".")
    if value not in BUILTIN_MODELS and not (sep and all(part.isidentifier() for part in dotted)):
        raise InvalidInput(field, f"{shown(value)} is unknown", fix or MODEL_FIX)
    return value


#: What JobSet appends to the name of a pod it creates after "<jobset>-<replicatedJob>-<job
#: index>-<pod index>": the Job controller's random suffix, as the webhook measures it.
JOBSET_POD_SUFFIX = "-abcde"


def jobset_pod_name(jobset: str, replicated_job: str, replicas: int, completions: int) -> str:
    """The longest pod name JobSet gives a replicated job's pods (its last job index, its last
    pod index), as jobset v0.12.0 ``pkg/webhooks/jobset_webhook.go`` builds it with
    ``placement.GenPodName`` (``pkg/util/placement/placement.go``) before checking it."""
    return f"{jobset}-{replicated_job}-{replicas - 1}-{completions - 1}{JOBSET_POD_SUFFIX}"


def longest_jobset_name(replicated_jobs: Collection[tuple[str, int, int]]) -> int:
    """How long a JobSet's (so a TrainJob's) name may be for the pod names of each of
    ``replicated_jobs`` ((name, replicas, completions)) to fit in a DNS-1035 label."""
    return min(DNS1123_LABEL_MAX - len(jobset_pod_name("", *job)) for job in replicated_jobs)


def jobset_pod_names(
    name: str, replicated_jobs: Collection[tuple[str, int, int]], field: str, fix: str = ""
) -> str:
    """A TrainJob's name whose JobSet's pod names all fit in 63 characters: JobSet's webhook
    refuses a longer one ("pod names generated for this JobSet will exceed 63 characters",
    jobset v0.12.0 ``pkg/webhooks/jobset_webhook.go``), and the Trainer then only emits a
    Warning event, so the TrainJob would never get a pod."""
    limit = longest_jobset_name(replicated_jobs)
    if len(name) > limit:
        longest = max((jobset_pod_name(name, *job) for job in replicated_jobs), key=len)
        raise InvalidInput(
            field,
            f"{shown(name)} is {len(name)} characters: JobSet would name a pod {longest} "
            f"({len(longest)} characters, more than {DNS1123_LABEL_MAX}), which Kubernetes "
            "refuses, so the job would never start",
            fix or f"use a name of at most {limit} characters",
        )
    return name


def pytorchjob_replica_names(
    name: str, num_nodes: int, field: str, fix: str = "", *, workers_only: bool = False
) -> str:
    """A PyTorchJob's name whose replicas' pod and Service names fit: the Training Operator
    names both ``<job>-<replica type, lowercase>-<index>`` (kubeflow/training-operator v1.9.0
    ``pkg/controller.v1/common/util.go`` ``GenGeneralName``, used by ``pod.go``
    ``createNewPod`` and ``service.go`` ``CreateNewService``), and a Service's name must be a
    DNS-1035 label of at most 63 characters, so a longer one never gets its Services and
    the job never starts. A fixed-size job is ``-master-0`` and ``-worker-0`` to
    ``-worker-<num_nodes - 2>``; an elastic one (``workers_only``: Worker replicas only, no
    Master) ``-worker-0`` to ``-worker-<num_nodes - 1>``."""
    if workers_only:
        replicas = [f"-worker-{num_nodes - 1}"]
    else:
        replicas = ["-master-0"] + ([f"-worker-{num_nodes - 2}"] if num_nodes > 1 else [])
    suffix = max(replicas, key=len)
    limit = DNS1123_LABEL_MAX - len(suffix)
    if len(name) > limit:
        longest = name + suffix
        raise InvalidInput(
            field,
            f"{shown(name)} is {len(name)} characters: the Training Operator would name a pod "
            f"and Service {longest} ({len(longest)} characters, more than {DNS1123_LABEL_MAX}), "
            "which Kubernetes refuses, so the job would never start",
            fix or f"use a name of at most {limit} characters",
        )
    return name
