"""``--param NAME=VALUE``, as `argo submit -p` and `kfp run create` take parameters, and what
the steps accept for each: `submit kfp|argo` and `run` refuse a value a step would refuse before
a server is contacted or a step runs, with the step's own rule (``kubetrain.rules``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from types import SimpleNamespace
from typing import NamedTuple, TypeVar

from kubetrain import rules
from kubetrain.backends.base import BACKENDS
from kubetrain.errors import InvalidInput
from kubetrain.jobspec import (
    AUTO_PROCS,
    DEFAULT_RUNTIME,
    MAX_RESTARTS,
    check_elastic,
    resolve_nodes,
    resolve_procs_per_node,
)
from kubetrain.render import launcher_for, refuse_elastic, refuse_launcher
from kubetrain.rules import LAUNCHERS, STRATEGIES, ZERO_STAGES

T = TypeVar("T")


def split_param(pair: str, declared: Collection[str], owner: str) -> tuple[str, str]:
    """``NAME=VALUE`` split, NAME checked against the parameters ``owner`` declares."""
    name, sep, value = pair.partition("=")
    if not sep:
        raise InvalidInput("--param", f"{pair!r} is not NAME=VALUE", "write --param nodes=4")
    if name not in declared:
        raise InvalidInput(
            "--param", f"the {owner} has no parameter {name!r}",
            f"use one of {', '.join(sorted(declared)) or '(none declared)'}",
        )  # fmt: skip
    return name, value


class Rule(NamedTuple):
    """What a step accepts for a parameter: ``check(text, field)`` raises the step's
    ``InvalidInput`` for a value the step would refuse; ``example`` is one it accepts."""

    check: Callable[[str, str], object]
    example: str

    def accepts(self, text: str) -> bool:
        try:
            self.check(text, "value")
        except InvalidInput:
            return False
        return True


def _parsed(
    parse: Callable[[str], T], kind: str, rule: Callable[[T, str], object], example: str
) -> Rule:
    """A number parameter: ``parse`` reads the text as the step's option does, ``rule`` checks
    the value."""

    def check(text: str, field: str) -> object:
        try:
            value = parse(text)
        except ValueError:
            raise InvalidInput(
                field, f"{rules.shown(text)} is not {kind}", f"give e.g. {example}"
            ) from None
        return rule(value, field)

    return Rule(check, example)


def _whole(low: int, example: str, high: int = rules.INT32_MAX) -> Rule:
    return _parsed(
        int, "a whole number", lambda value, field: rules.whole_number(value, field, low, high),
        example,
    )  # fmt: skip


def _within(accepts: Callable[[float], bool], expected: str, example: str) -> Rule:
    """A finite number a step other than launch checks with ``accepts``."""

    def rule(value: float, field: str) -> None:
        if not (math.isfinite(value) and accepts(value)):
            raise InvalidInput(
                field, f"{rules.shown(value)} is not {expected}", f"give e.g. {example}"
            )

    return _parsed(float, "a number", rule, example)


def _text(rule: Callable[[str, str], object], example: str, optional: bool = False) -> Rule:
    """A text parameter checked with ``rule``; when ``optional``, empty means the default."""

    def check(text: str, field: str) -> object:
        return text if optional and text == "" else rule(text, field)

    return Rule(check, example)


def _object_name(example: str, optional: bool = False) -> Rule:
    """An object's name (DNS-1123 subdomain), its fix naming an example of this parameter's
    kind (a claim, an account...), not the rule's generic one."""

    def check(text: str, field: str) -> object:
        fix = f"use lowercase letters, digits, '-' and '.' (at most 253), e.g. {example}"
        return rules.dns1123_subdomain(text, field, fix)

    return _text(check, example, optional)


def _one_of(*choices: str) -> Rule:
    return _text(lambda text, field: rules.one_of(text, field, choices), choices[0])


def _location(text: str, field: str) -> None:
    """A folder the nodes use: a path or a URL of a protocol fsspec knows (launch's check)."""
    from kubetrain import storage  # not for `kubetrain --help`

    storage.check_protocol(text, field)


def _procs_per_node(text: str, field: str) -> None:
    """What launch reads: auto, or a whole number from 1 (``jobspec.resolve_procs_per_node``)."""
    resolve_procs_per_node(text, 0, field)


def _unschedulable_grace(text: str, field: str) -> None:
    """What wait's ``unschedulable_grace`` reads: auto, empty, or 0 or more seconds."""
    from kubetrain.components.wait_trainjob.wait import unschedulable_grace  # not for --help

    unschedulable_grace(text)


def _stall_timeout(text: str, field: str) -> None:
    """What wait's ``stall_timeout`` reads: auto, or 0 (never) or more seconds."""
    from kubetrain.components.wait_trainjob.wait import stall_timeout  # not for --help

    stall_timeout(text, field)


# What the steps accept for the pipeline's and the workflow's parameters. A value a step would
# refuse is refused when the run is submitted, before the steps before it spend time and write
# outputs.
VALUE_RULES: dict[str, Rule] = {
    # The launch step's parameters, with the rules of TrainingOptions and TrainJobSpec.
    "nodes": Rule(resolve_nodes, "2"),
    "max_restarts": _whole(0, "3", high=MAX_RESTARTS),
    "procs_per_node": Rule(_procs_per_node, "auto"),
    "epochs": _whole(1, "10"),
    "keep_checkpoints": _whole(0, "3"),
    "batch_size": _whole(1, "32"),
    "gpu": _whole(0, "1"),
    "lr": _parsed(float, "a number", rules.positive_number, "0.001"),
    "model": _text(rules.model_spec, "mlp"),
    "strategy": _one_of(*STRATEGIES),
    "zero_stage": _parsed(
        int,
        "a whole number",
        lambda value, field: rules.one_of(value, field, ZERO_STAGES, "use 1, 2 or 3"),
        "2",
    ),
    "launcher": _one_of(*LAUNCHERS),
    "backend": _one_of(*BACKENDS),
    "image": _text(rules.image_reference, "ghcr.io/org/trainer:1.0", optional=True),
    "runtime": _object_name(DEFAULT_RUNTIME),
    # Empty: the namespace the step's pod runs in (the run's).
    "namespace": _text(rules.namespace, "default", optional=True),
    "cpu": _text(rules.quantity, "2", optional=True),
    "memory": _text(rules.quantity, "4Gi", optional=True),
    "service_account": _object_name("kubetrain", optional=True),
    "storage_secret": _object_name("kubetrain-storage", optional=True),
    "shared_pvc": _object_name("kubetrain-shared", optional=True),
    "checkpoint_dir": _text(_location, "/mnt/shared/checkpoints", optional=True),
    "storage": _text(_location, "s3://bucket/runs", optional=True),
    # Argo's promote step: the lasting claim it mounts, and the registry (a folder or a URL).
    "registry_pvc": _object_name("kubetrain-shared"),
    "model_registry": _text(_location, "/mnt/registry-pvc/registry", optional=True),
    # Other steps' parameters.
    "seed": _whole(0, "0", high=2**32 - 1),
    "test_fraction": _within(lambda v: 0 < v < 1, "a number strictly between 0 and 1", "0.2"),
    "validation_fraction": _within(lambda v: 0 <= v <= 0.5, "a number from 0 to 0.5", "0.1"),
    "accuracy_threshold": _within(lambda v: 0 <= v <= 1, "a fraction in [0, 1]", "0.95"),
    "wait_timeout_seconds": _within(lambda v: v >= 0, "0 (none) or more seconds", "3600"),
    "stall_timeout_seconds": Rule(_stall_timeout, "auto"),
    "on_cancel": _one_of("delete", "suspend"),
    "unschedulable_grace_seconds": Rule(_unschedulable_grace, "auto"),
    "export": _one_of("none", "torch-export", "torchscript"),
}


def check_value(name: str, value: object, field: str) -> None:
    """Refuse ``value`` of parameter ``name`` when a step would; ``field`` names the option."""
    rule = VALUE_RULES.get(name)
    if rule is not None:
        rule.check(str(value).lower() if isinstance(value, bool) else str(value), field)


def check_launcher(values: Mapping[str, object], option: Callable[[str], str]) -> None:
    """Refuse ``launcher`` where launch would, before a step runs: on a backend that cannot
    run it (``render.refuse_launcher``), or mpi with ``procs_per_node`` auto and no GPU
    (mpirun's hostfile needs the slots per node; ``launch.plan_launch``). ``values`` holds the
    run's parameters (text or numbers); ``option(name)`` is how the face names a parameter."""
    backend = str(values.get("backend", "trainer"))  # the launch step's default
    launcher = str(values.get("launcher", "torchrun"))
    refuse_launcher(SimpleNamespace(launcher=launcher), backend, option("launcher"))
    if launcher_for(launcher, backend) != "mpi":
        return
    if str(values.get("procs_per_node", AUTO_PROCS)) == AUTO_PROCS and not int(
        str(values.get("gpu") or 0)
    ):
        raise InvalidInput(
            option("procs_per_node"),
            "is auto with launcher mpi and no GPU: the hostfile needs the slots per node",
            "give the processes per node, e.g. 2",
        )


def check_elastic_values(
    values: Mapping[str, object], option: Callable[[str], str], own_program: bool = False
) -> None:
    """Refuse ``nodes`` MIN:MAX where launch would, before a step runs: on a backend without
    elastic jobs (``render.refuse_elastic``), with launcher mpi or deepspeed
    (``jobspec.check_elastic``). ``values`` holds the run's parameters (text or numbers);
    ``option(name)`` is how the face names a parameter; ``own_program``: the user's program
    runs, not our trainer, so ``strategy`` is not used."""
    nodes = str(values.get("nodes", "2"))
    refuse_elastic(nodes, str(values.get("backend", "trainer")), option("nodes"))
    check_elastic(
        nodes,
        str(values.get("launcher", "torchrun")),
        "" if own_program else str(values.get("strategy", "ddp")),
        option,
    )
