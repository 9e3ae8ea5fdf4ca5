"""Every error line a user sees is ``WHAT: PROBLEM; FIX`` (issue 28, "error lines without fix"):
a test that reads the source (ast), like the publish and HTTP guards.

Each construction of a ``KubetrainError`` (or of a class derived from it) in kubetrain/,
components/ and pipelines/ is found, raised or kept (``failure = KubetrainError(...)``), and
its message is rendered from the source: literal parts as written, a placeholder replaced by
what the source says it holds (a string constant of its module or imported, a local
variable's assignments, each branch of a conditional or an ``or``, a same-module function's
returns, what every call in the package passes for a parameter), so a message may render as
several alternatives. Each must hold a fix after its first ``"; "``: a clause (cut at ``;``,
``:``, ``,``, ``(``, `` or ``, `` and ``, `` then ``) that starts with an imperative
(``FIX_VERBS``), a program's command (``COMMANDS``) or a `` `command` `` to run; an
error of ours caught (``except ServerSilent as exc``) holds its own fix. What the
source cannot tell (an exception's text, a server's answer) renders as ``{expression}``, no
fix. ``InvalidInput(field, problem, fix)`` is the marker itself: its fix must not be empty. A
class whose ``__init__`` does not take the message first is checked at its
``super().__init__(...)``. ``ALLOWED`` lists the lines that need no fix, each with why;
``NOT_YET`` those in modules other sessions own, not given their fix yet."""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.test_http_guard import dotted, imported_names
from tests.test_import_layers import package_sources

BASE = "kubetrain.errors.KubetrainError"
INVALID_INPUT = "kubetrain.errors.InvalidInput"
#: The first word of a clause that tells the user what to do.
FIX_VERBS = frozenset(
    """add apply ask bake call cast change check choose collect copy create delete drop
    evaluate export fix follow free give grant include install keep launch lower look make move
    name pass pick point prepare put raise re-collect re-create re-export re-run read rebuild
    recompile refresh remove rename replace restore retry return run save see set ship start
    stop train try upgrade use wait write""".split()
)
#: Programs whose command, written out, is the fix (``pip install 'kubetrain[s3]'``).
COMMANDS = frozenset({"argo", "kubectl", "kubetrain", "pip"})
_CLAUSES = re.compile(r"[;:,(]\s*|\s+(?:or|and|then)\s+")
#: What an error of ours caught and put in another's message renders to: its own line, whose
#: fix was checked where it was made.
CAUGHT_ERROR = "{an error of ours}; see the fix it names"
#: More alternatives than this for one expression: rendered as the expression (no fix).
MAX_ALTERNATIVES = 1000

#: (module, function, words of the message as written) -> why that error line needs no fix.
ALLOWED = {
    ("kubetrain.errors", "__init__", "{fix}"): (
        "InvalidInput's own line: its fix is each caller's third argument, checked there"
    ),
    ("kubetrain.components.wait_trainjob.wait", "__init__", "message"): (
        "JobFailed: the job's own failure; the line is the failing rank's exception (printed "
        "after its log lines), which the user fixes in their program"
    ),
    ("kubetrain.cli.run", "stopped_whole_on_interrupt", "stopped by"): (
        "the user's own Ctrl-C or SIGTERM: the line says what was stopped, nothing to fix"
    ),
    ("kubetrain.components.evaluate_model.evaluate", "evaluate_with_program", "stopped by"): (
        "the user's own Ctrl-C or SIGTERM: the line says what was stopped, nothing to fix"
    ),
    ("kubetrain.backends.kubernetes.backend", "wait", "cancelled by"): (
        "the user's own Ctrl-C or SIGTERM: the line says what was done with the job"
    ),
    ("kubetrain.train.trainer", "_hold_checkpoint_dir", "rank 0 refused"): (
        "the other ranks relay rank 0's own refusal (its message, which holds the fix) as text"
    ),
    ("kubetrain.cli.run", "run", "view.failure"): (
        "RunOutput.failure (kubetrain.cli.run_output) makes the line, which the source here "
        "cannot render: `step NAME failed: CAUSE; to see more: kubetrain logs JOB` (the step's "
        "own line, then the command), or the fallback run gives it, which ends the same way; "
        "test_a_failed_run_ends_with_the_command_to_see_more checks both"
    ),
    ("kubetrain.train.ray", "worker_failure", "rank {rank}: {line}"): (
        "a Ray Train worker's own failure line (errors.failure_line: an error of ours with its "
        "fix, describe()'s path and fix, or an internal error's `please report it`), prefixed "
        "with the rank it came from"
    ),
}
#: (module, function, words of the message as written) -> the error line without a fix, in
#: a module another session owns (issue 28); each goes once its line says what to do.
NOT_YET: dict[tuple[str, str, str], str] = {}


@dataclass(frozen=True)
class Site:
    """One construction of an error: where, its message (or fix) as written, and what of each
    text it renders to can tell a fix (``_relevant``)."""

    module: str
    line: int
    function: str
    source: str
    texts: tuple[str, ...]

    def __str__(self) -> str:
        return (
            f"{self.module}:{self.line} ({self.function}): {self.source[:160]} "
            f"-> {' | '.join(self.texts)[:200]}"
        )

    def listed_in(self, entries: dict[tuple[str, str, str], str]) -> bool:
        return any(
            (module, function) == (self.module, self.function) and words in self.source
            for module, function, words in entries
        )


def has_fix(text: str) -> bool:
    """Whether the message ``text`` has a clause after its first ``"; "`` that starts with an
    imperative, a program's command or a `` `command` ``."""
    _, separator, rest = text.partition("; ")
    if not separator:
        return False
    for clause in _CLAUSES.split(rest):
        words = clause.split()
        if words and (words[0].lower() in FIX_VERBS | COMMANDS or words[0].startswith("`")):
            return True
    return False


def _is_concatenation(node: ast.expr) -> bool:
    """An f-string or a ``+`` of texts."""
    return isinstance(node, ast.JoinedStr) or (
        isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add)
    )


def _opaque(node: ast.expr) -> str:
    """An expression the source cannot tell, as one word (``{str(exc)}``): no fix."""
    return "{" + "".join(ast.unparse(node).split()) + "}"


def _skeleton(text: str) -> str:
    """``text`` with each clause cut to its first word (``"is …"``), its separators and its
    edges kept: all a fix is told by, so many names of one folder are one alternative."""
    pieces = re.split(f"({_CLAUSES.pattern})", text)
    for index in range(0, len(pieces), 2):  # the clauses, between the separators
        words = pieces[index].split()
        if len(words) > 1:
            piece = pieces[index]
            lead = piece[: len(piece) - len(piece.lstrip())]
            trail = piece[len(piece.rstrip()) :]
            pieces[index] = f"{lead}{words[0]} …{words[-1][-1:]}{trail}"
    return "".join(pieces)


def _relevant(text: str) -> str:
    """What of a message's text (or of its start) can still tell a fix: from its first
    ``"; "`` on, or, before one, its last character (a ``";"`` the next part may complete).
    Many names of one folder are then one alternative."""
    _, separator, rest = text.partition("; ")
    if separator:
        return "…; " + rest
    return "…" + text[-1:] if text else ""


Function = ast.FunctionDef | ast.AsyncFunctionDef


def _functions(tree: ast.AST) -> dict[int, Function]:
    """id of each node -> the innermost function it lies in."""
    enclosing: dict[int, Function] = {}

    def visit(node: ast.AST, function: Function | None) -> None:
        if isinstance(node, Function):
            function = node
        for child in ast.iter_child_nodes(node):
            if function is not None:
                enclosing[id(child)] = function
            visit(child, function)

    visit(tree, None)
    return enclosing


def _called_name(call: ast.Call) -> str | None:
    """The last part of the called name: ``f`` of ``f(...)``, ``obj.f(...)``, ``a.b.f(...)``."""
    if isinstance(call.func, ast.Name):
        return call.func.id
    return call.func.attr if isinstance(call.func, ast.Attribute) else None


def _own_init(node: ast.ClassDef) -> ast.FunctionDef | None:
    return next(
        (f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None
    )


class Package:
    """The parsed modules, and what an expression in one of them renders to."""

    def __init__(self, sources: dict[str, str]) -> None:
        self.trees = {module: ast.parse(source) for module, source in sources.items()}
        self.names = {module: imported_names(tree) for module, tree in self.trees.items()}
        self.enclosing = {module: _functions(tree) for module, tree in self.trees.items()}
        self.calls: dict[str, list[tuple[str, ast.Call]]] = {}
        for module, tree in self.trees.items():
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and (name := _called_name(node)):
                    self.calls.setdefault(name, []).append((module, node))
        self.errors = self._error_classes()
        self._rendering: set[tuple[str, str, int]] = set()

    def _bases(self, name: str, node: ast.ClassDef) -> set[str]:
        module = name.rpartition(".")[0]
        found = {dotted(base, self.names[module]) or "" for base in node.bases}
        return found | {f"{module}.{b.id}" for b in node.bases if isinstance(b, ast.Name)}

    def _error_classes(self) -> dict[str, ast.ClassDef]:
        """Dotted name -> definition of KubetrainError and each class derived from it."""
        defined = {
            f"{module}.{node.name}": node
            for module, tree in self.trees.items()
            for node in tree.body
            if isinstance(node, ast.ClassDef)
        }
        errors = {BASE: defined[BASE]}
        grown = True
        while grown:
            grown = False
            for name, node in defined.items():
                if name not in errors and self._bases(name, node) & errors.keys():
                    errors[name] = node
                    grown = True
        return errors

    def takes_message_first(self, name: str) -> bool:
        """Whether the constructor of error class ``name`` (its own, or the nearest parent's)
        takes the message first, as KubetrainError's does."""
        while name != BASE:
            node = self.errors[name]
            init = _own_init(node)
            if init is not None:
                return [a.arg for a in init.args.args[1:2]] == ["message"]
            name = next(p for p in self._bases(name, node) if p in self.errors)
        return True

    def constant(self, module: str, name: str) -> ast.expr | None:
        """The value a module-level ``NAME = ...`` assigns, if ``module`` is ours and has it."""
        for node in self.trees[module].body if module in self.trees else []:
            targets = node.targets if isinstance(node, ast.Assign) else []
            if isinstance(node, ast.AnnAssign):
                targets = [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return node.value  # type: ignore[union-attr]
        return None

    def message(self, module: str, node: ast.expr, scope: Function | None) -> tuple[str, ...]:
        """What of each text the message ``node`` renders to can tell a fix (``_relevant``,
        applied as the message is put together: a message of many placeholders, each of
        many names, stays a few alternatives)."""
        key = ("message", module, id(node))
        if key in self._rendering:  # a cycle (``message = message or ...``)
            return (_relevant(_opaque(node)),)
        self._rendering.add(key)
        try:
            return self._message(module, node, scope)
        finally:
            self._rendering.discard(key)

    def _message(self, module: str, node: ast.expr, scope: Function | None) -> tuple[str, ...]:
        if _is_concatenation(node):
            parts = node.values if isinstance(node, ast.JoinedStr) else [node.left, node.right]
            texts: tuple[str, ...] = ("",)
            for part in parts:
                if isinstance(part, ast.FormattedValue):
                    part = part.value
                pieces = self.render(module, part, scope)
                texts = tuple(dict.fromkeys(_relevant(t + p) for t in texts for p in pieces))
            return texts
        if isinstance(node, ast.Name) and (assigned := self._assigned(node.id, scope)):
            return tuple(t for value in assigned for t in self.message(module, value, scope))
        if isinstance(node, ast.IfExp | ast.BoolOp):
            branches = [node.body, node.orelse] if isinstance(node, ast.IfExp) else node.values
            return tuple(t for value in branches for t in self.message(module, value, scope))
        return tuple(dict.fromkeys(_relevant(t) for t in self.render(module, node, scope)))

    def render(self, module: str, node: ast.expr, scope: Function | None) -> tuple[str, ...]:
        """Each text ``node`` (in ``scope``, a function of ``module``) may stand for."""
        key = ("text", module, id(node))
        if key in self._rendering:  # a cycle (a parameter passed on to itself)
            return (_opaque(node),)
        self._rendering.add(key)
        try:
            texts = self._render(module, node, scope)
        finally:
            self._rendering.discard(key)
        texts = tuple(dict.fromkeys(_skeleton(text) for text in texts))
        return texts if len(texts) <= MAX_ALTERNATIVES else (_opaque(node),)

    def _render(self, module: str, node: ast.expr, scope: Function | None) -> tuple[str, ...]:
        def each(*parts: ast.expr) -> list[tuple[str, ...]]:
            return [self.render(module, part, scope) for part in parts]

        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return (node.value,)
        if _is_concatenation(node):
            parts = node.values if isinstance(node, ast.JoinedStr) else [node.left, node.right]
            texts = [""]
            for part in parts:
                if isinstance(part, ast.Constant):
                    pieces: tuple[str, ...] = (str(part.value),)
                else:
                    value = part.value if isinstance(part, ast.FormattedValue) else part
                    pieces = self.render(module, value, scope)
                texts = [t + p for t in texts for p in pieces][: MAX_ALTERNATIVES + 1]
            return tuple(texts)
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            return tuple(t for texts in each(*node.values) for t in texts)
        if isinstance(node, ast.IfExp):
            return tuple(t for texts in each(node.body, node.orelse) for t in texts)
        if isinstance(node, ast.Name) and self._caught_error(module, node, scope):
            return (CAUGHT_ERROR,)
        if isinstance(node, ast.Name):
            assigned = self._assigned(node.id, scope)
            if assigned:
                return tuple(t for texts in each(*assigned) for t in texts)
            passed = self._passed(node.id, scope)
            if passed:
                return passed
            owner, _, name = (dotted(node, self.names[module]) or node.id).rpartition(".")
            value = self.constant(owner or module, name)
            if value is not None:
                return self.render(owner or module, value, None)
        if isinstance(node, ast.Call) and (function := self._own_function(module, node)):
            returned = [
                r.value for r in ast.walk(function) if isinstance(r, ast.Return) and r.value
            ]
            return tuple(t for r in returned for t in self.render(module, r, function))
        return (_opaque(node),)

    def _caught_error(self, module: str, node: ast.Name, scope: Function | None) -> bool:
        """Whether ``node`` is the name bound by the innermost ``except SomeKubetrainError as
        NAME`` around it."""
        handlers = [
            handler
            for handler in (ast.walk(scope) if scope is not None else [])
            if isinstance(handler, ast.ExceptHandler)
            and handler.name == node.id
            and any(inner is node for inner in ast.walk(handler))
        ]
        if not handlers:
            return False
        handler = max(handlers, key=lambda h: h.lineno)
        types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        caught = {
            f"{module}.{kind.id}"
            if isinstance(kind, ast.Name) and f"{module}.{kind.id}" in self.errors
            else dotted(kind, self.names[module])
            for kind in types
            if kind is not None
        }
        return bool(caught) and caught <= self.errors.keys()

    def _own_function(self, module: str, call: ast.Call) -> ast.FunctionDef | None:
        """The function of ``module`` that ``call`` calls: ``f(...)`` a module-level one,
        ``self.f(...)`` the one method of that name in the module."""
        if isinstance(call.func, ast.Name):
            candidates = [f for f in self.trees[module].body if isinstance(f, ast.FunctionDef)]
            name = call.func.id
        elif isinstance(call.func, ast.Attribute) and ast.unparse(call.func.value) == "self":
            candidates = [
                f
                for c in self.trees[module].body
                if isinstance(c, ast.ClassDef)
                for f in c.body
                if isinstance(f, ast.FunctionDef)
            ]
            name = call.func.attr
        else:
            return None
        named = [f for f in candidates if f.name == name]
        return named[0] if len(named) == 1 else None

    @staticmethod
    def _assigned(name: str, scope: Function | None) -> list[ast.expr]:
        """What ``name`` is assigned in the function ``scope`` (all of it, in any branch),
        but for a value made from itself (``message = message.replace(...)``: the same text)."""
        if scope is None:
            return []
        return [
            node.value
            for node in ast.walk(scope)
            if isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
            and not any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(node.value))
        ]

    def _passed(self, name: str, scope: Function | None) -> tuple[str, ...]:
        """What each call in the package passes for the parameter ``name`` of the function
        ``scope``; nothing when it is no parameter or no call passes it."""
        if scope is None or scope.name == "__init__":  # a class's: its calls name the class
            return ()
        arguments = scope.args
        positional = [a.arg for a in [*arguments.posonlyargs, *arguments.args]]
        if positional[:1] == ["self"]:
            positional = positional[1:]
        if name not in positional + [a.arg for a in arguments.kwonlyargs]:
            return ()
        index = positional.index(name) if name in positional else None
        texts: list[str] = []
        for module, call in self.calls.get(scope.name, []):
            given = next((k.value for k in call.keywords if k.arg == name), None)
            if given is None and index is not None and index < len(call.args):
                given = call.args[index]
            if given is not None:
                texts += self.render(module, given, self.enclosing[module].get(id(call)))
        return tuple(texts)


def sites(sources: dict[str, str]) -> Iterator[tuple[Site, bool]]:
    """Each error construction in ``sources`` (module -> source), with whether it holds a fix."""
    package = Package(sources)
    message_first = {name for name in package.errors if package.takes_message_first(name)}
    for module, tree in package.trees.items():
        in_error_init = {
            id(child)
            for node in tree.body
            if isinstance(node, ast.ClassDef)
            and f"{module}.{node.name}" in package.errors
            and (init := _own_init(node)) is not None
            for child in ast.walk(init)
        }
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            called = dotted(node.func, package.names[module])
            if isinstance(node.func, ast.Name) and f"{module}.{node.func.id}" in package.errors:
                called = f"{module}.{node.func.id}"
            is_super_init = (
                id(node) in in_error_init
                and _called_name(node) == "__init__"
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Call)
                and _called_name(node.func.value) == "super"
            )
            if called == INVALID_INPUT:
                position, keyword = 2, "fix"
            elif is_super_init or called in message_first:
                position, keyword = 0, "message"
            else:
                continue
            argument = next((k.value for k in node.keywords if k.arg == keyword), None)
            if argument is None and len(node.args) > position:
                argument = node.args[position]
            if argument is None:
                continue  # no message: the class composes it (checked at its super().__init__)
            function = package.enclosing[module].get(id(node))
            if (
                is_super_init
                and isinstance(argument, ast.Name)
                and argument.id in [a.arg for a in function.args.args]  # type: ignore[union-attr]
            ):
                continue  # the caller's message passed on: checked where the caller made it
            texts = package.message(module, argument, function)
            name = function.name if function else ""
            site = Site(module, node.lineno, name, ast.unparse(argument), texts)
            if called == INVALID_INPUT:  # the 3-argument form is the marker: a fix, not empty
                yield site, all(text.strip() for text in texts)
            else:
                yield site, all(has_fix(text) for text in texts)


def violations(sources: dict[str, str]) -> list[str]:
    """Each error line without a fix, outside ``ALLOWED`` and ``NOT_YET``."""
    return [
        str(site)
        for site, fixed in sites(sources)
        if not fixed and not site.listed_in(ALLOWED) and not site.listed_in(NOT_YET)
    ]


def test_every_error_line_names_its_fix() -> None:
    sources = package_sources()
    found = list(sites(sources))
    assert len(found) > 300  # the walk found the error lines
    assert violations(sources) == []


def test_each_listed_exception_still_matches_a_line_without_fix() -> None:
    """An entry of ALLOWED or NOT_YET whose line was given its fix (or moved) goes."""
    unfixed = [site for site, fixed in sites(package_sources()) if not fixed]
    for entries in (ALLOWED, NOT_YET):
        stale = [e for e in entries if not any(s.listed_in({e: ""}) for s in unfixed)]
        assert stale == []


ERRORS_MODULE = "kubetrain.errors"
PLANTED_IMPORT = "from kubetrain.errors import IntegrityError, InvalidInput, KubetrainError\n"
READ = """
def read(folder, what, if_foreign):
    raise IntegrityError(f"{what}: format foreign; {if_foreign}")
"""
COMPOSED = """
class Composed(KubetrainError):
    def __init__(self, what):
        super().__init__(f"{what} is broken; " + TEXT)
"""


def planted_violations(planted: str) -> list[str]:
    """The violations of a module planted beside kubetrain.errors."""
    sources = {
        ERRORS_MODULE: package_sources()[ERRORS_MODULE],
        "kubetrain.planted": PLANTED_IMPORT + planted,
    }
    return [line for line in violations(sources) if line.startswith("kubetrain.planted:")]


def make(body: str) -> str:
    return f"def make(x, exc):\n    {body}\n"


@pytest.mark.parametrize(
    ("planted", "fixed"),
    [
        pytest.param(make('raise KubetrainError(f"{x} is broken")'), False, id="no-fix"),
        pytest.param(make('raise IntegrityError(f"{x}: bad; refused unread")'), False, id="fact"),
        pytest.param(make('raise IntegrityError(f"{x}: bad; re-create it")'), True, id="verb"),
        pytest.param(make('raise IntegrityError(f"{x}: bad, re-create it")'), False, id="no-;"),
        pytest.param(make('raise KubetrainError(f"{x}; see `kubetrain logs`")'), True, id="cmd"),
        pytest.param(make('raise KubetrainError(f"{x}: {exc}")'), False, id="exception-text"),
        pytest.param(make('failure = KubetrainError(f"{x} failed: {exc!r}")'), False, id="kept"),
        pytest.param(make('raise InvalidInput("--x", "is bad", "")'), False, id="empty-fix"),
        pytest.param(make('raise InvalidInput("--x", "is bad", "give y")'), True, id="3-args"),
        pytest.param(
            'FIX = "re-create the folder"\n' + make('raise KubetrainError(f"{x}; {FIX}")'),
            True,
            id="constant-fix",
        ),
        pytest.param(
            'FACT = "it is foreign"\n' + make('raise KubetrainError(f"{x}; {FACT}")'),
            False,
            id="constant-fact",
        ),
        pytest.param(
            "class Refused(IntegrityError):\n    pass\n\n\n"
            + make('raise Refused(f"{x} has no model tensors")'),
            False,
            id="subclass",
        ),
        pytest.param(
            make('message = f"{x}: bad" if x else f"{x}: bad; use y"')
            + "    raise KubetrainError(message)\n",
            False,
            id="one-branch-without-fix",
        ),
        pytest.param(
            READ + make('read(x, "dataset", if_foreign="run `kubetrain prep`")'),
            True,
            id="passed-fix",
        ),
        pytest.param(
            READ + make('read(x, "dataset", if_foreign="it is foreign")'), False, id="passed-fact"
        ),
        pytest.param('TEXT = "see the log"\n' + COMPOSED, True, id="composed-fix"),
        pytest.param('TEXT = "no more"\n' + COMPOSED, False, id="composed-fact"),
        pytest.param(
            "class Refused(IntegrityError):\n    pass\n\n\n"
            + make(
                "try:\n        x()\n    except Refused as caught:\n"
                '        raise KubetrainError(f"could not create the run: {caught}")'
            ),
            True,
            id="ours-caught",
        ),
        pytest.param(
            make(
                "try:\n        x()\n    except OSError as caught:\n"
                '        raise KubetrainError(f"could not create the run: {caught}")'
            ),
            False,
            id="theirs-caught",
        ),
    ],
)
def test_a_planted_error_line_without_fix_is_caught(planted: str, fixed: bool) -> None:
    found = planted_violations(planted)
    assert (found == []) is fixed, found


# --- the lines as a user sees them -----------------------------------------------------------


def collect_refusal(
    capsys: pytest.CaptureFixture[str], checkpoint_dir: Path, out: Path, *extra: str
) -> str:
    """The one line ``kubetrain collect`` refuses ``checkpoint_dir`` with (nothing published)."""
    from kubetrain.cli import main

    argv = ["collect", "--checkpoint-dir", str(checkpoint_dir), "--output", str(out), *extra]
    code = main(argv)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code != 0 and len(lines) == 1 and not out.exists(), lines
    return lines[0]


def test_collect_of_a_dtype_safetensors_cannot_hold_says_to_cast(tmp_path, capsys) -> None:
    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp

    state = {"weight": torch.zeros(2, 2, dtype=torch.complex64)}
    dcp.save({"model": state}, checkpoint_id=str(tmp_path / "ckpt"), no_dist=True)
    line = collect_refusal(capsys, tmp_path / "ckpt", tmp_path / "model")
    assert "complex64 tensor, which safetensors cannot hold; cast the model" in line
    assert has_fix(line)


def test_collect_of_our_checkpoint_with_a_broken_manifest_says_to_re_create_it(
    tmp_path, capsys
) -> None:
    torch = pytest.importorskip("torch")
    from kubetrain.artifacts.checkpoint import save_checkpoint
    from kubetrain.artifacts.manifest import REWRITE

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2))
    epoch = save_checkpoint(
        tmp_path / "ckpt", model, torch.optim.SGD(model.parameters(), lr=0.1), epoch=1, step=1,
        strategy="ddp", model_info={"spec": "mlp", "sample_shape": [4], "num_classes": 2},
        metrics=[],
    )  # fmt: skip
    (Path(epoch) / "manifest.json").write_text("{not json")
    line = collect_refusal(
        capsys, tmp_path / "ckpt", tmp_path / "model", "--checkpoint-file", Path(epoch).name
    )
    assert "manifest.json is not valid JSON" in line and line.endswith(f"; {REWRITE}")
    assert has_fix(line)


def test_a_failed_run_ends_with_the_command_to_see_more(tmp_path, capsys, monkeypatch) -> None:
    """The ALLOWED line of kubetrain.cli.run: a step's failure, and a pipeline failure no step
    explains (KFP's runner failing before or around the steps), each end in the command."""
    import io

    from kubetrain.cli import main
    from kubetrain.cli.run_output import RunOutput
    from kubetrain.pipelines import training_pipeline

    view = RunOutput(verbose=False, stream=io.StringIO(), colour=False)
    view.step_started("wait-trainjob")
    view.step_line("the job failed")
    view.step_ended(False)
    line = view.failure("kubetrain logs j", "pipeline failed")
    assert line == "step wait-trainjob failed: the job failed; to see more: kubetrain logs j"
    assert has_fix(line)

    def pipeline(**_: object) -> None:
        raise RuntimeError("Pipeline 'training-pipeline' finished with status FAILURE.")

    monkeypatch.setattr(training_pipeline, "build_training_pipeline", lambda *_: pipeline)
    monkeypatch.setenv("KUBETRAIN_LOCAL_ROOT", str(tmp_path / "local"))
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--output", str(tmp_path / "runs")]) != 0
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.endswith(
        "pipeline failed: Pipeline 'training-pipeline' finished with status FAILURE.; to see "
        "more: kubetrain run --verbose (the same options)"
    ), line
    assert has_fix(line)


@pytest.mark.parametrize(
    ("status", "fix"),
    [
        (403, "give a token whose account may do this in namespace default"),
        (502, "retry once the Argo Server answers again"),
        (409, "fix what the server names"),
    ],
)
def test_an_argo_server_refusal_says_what_to_do(status, fix, capsys, monkeypatch) -> None:
    """Each status the Argo Server answers gets its fix after the server's message (403 said
    only that the token may not, the others nothing)."""
    from kubetrain.cli import main
    from tests.support.argo_server import ArgoServer

    for name in [name for name in os.environ if name.startswith("ARGO_")]:
        monkeypatch.delenv(name)
    with ArgoServer() as server:
        server.fail(status, times=3)
        assert main(["submit", "argo", "--host", server.url]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"answered {status} " in line and f": injected; {fix}" in line, line
    assert has_fix(line)


@pytest.mark.parametrize(
    ("status", "verb", "fix"),
    [
        (404, "get", "check the name and the namespace (`kubectl get trainjobs."),
        (409, "create", "choose another name, or delete the one there"),
        (409, "patch", "retry: the object changed while it was written"),
        (422, "create", "fix what the server names"),
        (503, "list", "retry once the API server answers again"),
    ],
)
def test_an_api_server_refusal_says_what_to_do(status, verb, fix) -> None:
    """The API server's refusals but 401 and 403 (whose fixes were there) as a user reads them:
    the server's message, then what to do."""
    from kubernetes.client.exceptions import ApiException

    from kubetrain.backends.kubernetes.client import Action, translate

    refused = ApiException(status=status, reason="Refused")
    refused.body = '{"message": "trainjobs.trainer.kubeflow.org \\"demo\\" is refused"}'
    action = Action(verb, "trainjobs", "trainer.kubeflow.org", "demo", "default")
    line = str(translate(refused, action))
    assert f'"demo" is refused; {fix}' in line, line
    assert has_fix(line)
