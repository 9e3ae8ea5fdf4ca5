"""The part of Argo's expression language (expr-lang, github.com/expr-lang/expr) that a
``retryStrategy.expression`` of ours uses, evaluated safely for the local Argo executor.

Argo evaluates the expression after each failed attempt with ``lastRetry.exitCode``,
``lastRetry.status``, ``lastRetry.duration`` and ``lastRetry.message`` (all strings; exitCode
"-1" when there is none), and retries only when it is true (argo-workflows docs/retries.md;
workflow/controller/operator.go ``processNodeRetries``: ``argoexpr.EvalBool`` on
``buildRetryStrategyLocalScope``). Supported: ``&&``, ``||``, ``!``, ``==``, ``!=``, ``<``,
``<=``, ``>``, ``>=``, ``in [...]``, parentheses, string and number literals, ``true``/
``false``, variables with dots, and the functions ``asInt``, ``asFloat`` and ``string``.
Anything else raises ``UnsupportedExpression``: the executor refuses it rather than guessing.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Mapping
from typing import Any


class UnsupportedExpression(ValueError):
    """An expression outside the supported subset, or one that does not evaluate."""


FUNCTIONS: dict[str, Callable[[Any], Any]] = {"asInt": int, "asFloat": float, "string": str}
_TOKEN = re.compile(
    r"""\s*(?:
        (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
      | (?P<number>\d+(?:\.\d+)?)
      | (?P<name>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)
      | (?P<op>&&|\|\||==|!=|<=|>=|!|<|>|\(|\)|\[|\]|,)
    )""",
    re.VERBOSE,
)
_KEYWORDS = {"true": "True", "false": "False", "in": "in", "and": "and", "or": "or", "not": "not"}
_OPERATORS = {"&&": " and ", "||": " or ", "!": " not "}
_ALLOWED = (
    ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.Compare, ast.Eq,
    ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn, ast.Call, ast.Name,
    ast.Load, ast.Constant, ast.List,
)  # fmt: skip


def _to_python(expression: str) -> tuple[str, dict[str, str]]:
    """The expression as Python source, each dotted variable renamed to ``v0``, ``v1``..."""
    source, names, at = [], {}, 0
    while at < len(expression):
        match = _TOKEN.match(expression, at)
        if match is None or match.end() == at:
            if expression[at:].strip() == "":
                break
            raise UnsupportedExpression(f"cannot read {expression[at:]!r} in {expression!r}")
        at = match.end()
        if match["string"] is not None or match["number"] is not None:
            source.append(match["string"] or match["number"])
        elif match["name"] is not None:
            word = match["name"]
            if word in _KEYWORDS:
                source.append(f" {_KEYWORDS[word]} ")
            elif word in FUNCTIONS:
                source.append(word)
            else:
                names.setdefault(word, f"v{len(names)}")
                source.append(names[word])
        else:
            source.append(_OPERATORS.get(match["op"], match["op"]))
    return "".join(source), names


def evaluate_bool(expression: str, variables: Mapping[str, str]) -> bool:
    """``expression`` with ``variables`` (e.g. ``{"lastRetry.exitCode": "2"}``), which must
    evaluate to a boolean, as Argo's ``EvalBool`` requires."""
    source, names = _to_python(expression)
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except SyntaxError:
        raise UnsupportedExpression(f"not a supported expression: {expression!r}") from None
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED):
            raise UnsupportedExpression(f"{type(node).__name__} in {expression!r}")
        if isinstance(node, ast.Call) and (
            not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS or node.keywords
        ):
            raise UnsupportedExpression(f"a call other than {sorted(FUNCTIONS)} in {expression!r}")
    unknown = [word for word in names if word not in variables]
    if unknown:
        raise UnsupportedExpression(f"unknown variable(s) {unknown} in {expression!r}")
    scope = {alias: variables[word] for word, alias in names.items()}
    try:
        value = eval(
            compile(tree, "<argo expression>", "eval"), {"__builtins__": {}, **FUNCTIONS}, scope
        )  # noqa: S307 - checked tree: only the nodes above
    except (TypeError, ValueError) as error:
        raise UnsupportedExpression(f"{expression!r} does not evaluate: {error}") from None
    if not isinstance(value, bool):
        raise UnsupportedExpression(f"{expression!r} is not a boolean expression")
    return value
