"""``--param NAME=VALUE``, as `argo submit -p` and `kfp run create` take parameters."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from typing import NamedTuple

from kubetrain.errors import InvalidInput
from kubetrain.training_choices import STRATEGIES, is_model_spec


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
    """What a step accepts for a parameter: ``accepts(text)``, said as ``expected``."""

    accepts: Callable[[str], bool]
    expected: str
    example: str


def _whole(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _whole_in(low: int, high: int | None, example: str) -> Rule:
    def accepts(text: str) -> bool:
        value = _whole(text)
        return value is not None and value >= low and (high is None or value < high)

    expected = (
        f"a whole number >= {low}" if high is None else f"a whole number in {low}..{high - 1}"
    )
    return Rule(accepts, expected, example)


def _number_in(accepts: Callable[[float], bool], expected: str, example: str) -> Rule:
    return Rule(lambda text: (v := _number(text)) is not None and accepts(v), expected, example)


def _one_of(*choices: str) -> Rule:
    return Rule(lambda text: text in choices, f"one of {', '.join(choices)}", choices[0])


# What the steps accept for the pipeline's and the workflow's parameters (kept literal: this
# module is imported by `kubetrain --help`). A value a step would refuse is refused when the run
# is submitted, before the steps before it spend time and write outputs.
VALUE_RULES: dict[str, Rule] = {
    "nodes": _whole_in(1, None, "2"),
    "procs_per_node": _whole_in(1, None, "1"),
    "epochs": _whole_in(1, None, "10"),
    "batch_size": _whole_in(1, None, "32"),
    "gpu": _whole_in(0, None, "1"),
    "seed": _whole_in(0, 2**32, "0"),
    "lr": _number_in(lambda v: v > 0, "a number > 0", "0.001"),
    "test_fraction": _number_in(lambda v: 0 < v < 1, "a number strictly between 0 and 1", "0.2"),
    "accuracy_threshold": _number_in(lambda v: 0 <= v <= 1, "a fraction in [0, 1]", "0.95"),
    "wait_timeout_seconds": _number_in(lambda v: v >= 0, "0 (none) or more seconds", "3600"),
    "model": Rule(is_model_spec, "mlp, cnn or package.module:callable", "mlp"),
    "strategy": _one_of(*STRATEGIES),
    "backend": _one_of("local", "trainer", "job"),
    "on_cancel": _one_of("delete", "suspend"),
    "export": _one_of("none", "torch-export", "torchscript"),
}


def check_value(name: str, value: object, field: str) -> None:
    """Refuse ``value`` of parameter ``name`` when a step would; ``field`` names the option."""
    rule = VALUE_RULES.get(name)
    text = str(value).lower() if isinstance(value, bool) else str(value)
    if rule is not None and not rule.accepts(text):
        raise InvalidInput(field, f"{text!r} is not {rule.expected}", f"give e.g. {rule.example}")
