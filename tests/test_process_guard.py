"""Every process kubetrain starts goes through kubetrain.backends.owned_processes (its own
session, under a child subreaper, stopped with what it started): a test that reads the source
(ast), like the HTTP clients' guard (tests/test_http_guard.py). Any use of a function that
starts a process (``subprocess.Popen``/``run``/..., ``os.system``/``fork``/``exec*``/
``spawn*``, ``pty.spawn``, ``asyncio.create_subprocess_*``, ``multiprocessing``'s processes
and pools) elsewhere in kubetrain/, components/ or pipelines/ fails it. A call written inside a
string (a generated script's text) is no call: only code counts."""

from __future__ import annotations

import ast
from collections.abc import Iterator

import pytest

from tests.test_http_guard import annotation_nodes, dotted, imported_names
from tests.test_import_layers import package_sources

RUNNER = "kubetrain.backends.owned_processes"
#: What starts a process, by its dotted name.
PROCESS_STARTERS = frozenset(
    {
        *(
            f"subprocess.{name}"
            for name in (
                "Popen",
                "run",
                "call",
                "check_call",
                "check_output",
                "getoutput",
                "getstatusoutput",
            )
        ),
        *(f"os.{name}" for name in ("system", "popen", "fork", "forkpty")),
        "pty.spawn",
        "pty.fork",
        "asyncio.create_subprocess_exec",
        "asyncio.create_subprocess_shell",
        "asyncio.subprocess.create_subprocess_exec",
        "asyncio.subprocess.create_subprocess_shell",
        *(
            f"{package}.{name}"
            for package in ("multiprocessing", "torch.multiprocessing")
            for name in ("Process", "Pool", "get_context", "spawn", "start_processes")
        ),
        "multiprocessing.pool.Pool",
        "multiprocessing.context.Process",
        "concurrent.futures.ProcessPoolExecutor",
        "concurrent.futures.process.ProcessPoolExecutor",
    }
)
#: os functions that replace or start a process, by the start of their name.
OS_STARTER_PREFIXES = ("os.exec", "os.spawn", "os.posix_spawn")
#: (module, process starter) allowed outside the runner, each with why.
ALLOWED: dict[tuple[str, str], str] = {}


def is_process_starter(name: str) -> bool:
    return name in PROCESS_STARTERS or name.startswith(OS_STARTER_PREFIXES)


def uses(source: str) -> Iterator[tuple[int, str]]:
    """(line, name) for each use of a process starter in ``source``: a reference to one
    (called or passed on), or ``getattr(module, "name")`` naming one."""
    tree = ast.parse(source)
    names = imported_names(tree)
    in_annotation = annotation_nodes(tree)
    for node in ast.walk(tree):
        if id(node) in in_annotation:
            continue
        if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load):
            name = dotted(node, names)
            if name and is_process_starter(name):
                yield node.lineno, name
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            owner = dotted(node.args[0], names)
            if owner and is_process_starter(name := f"{owner}.{node.args[1].value}"):
                yield node.lineno, name


def violations(sources: dict[str, str]) -> list[str]:
    """Each use of a process starter outside the runner, as ``module:line: name``."""
    return [
        f"{module}:{line}: {name}"
        for module, source in sorted(sources.items())
        if module != RUNNER
        for line, name in sorted(set(uses(source)))
        if (module, name) not in ALLOWED
    ]


def test_every_process_is_started_by_the_owned_runner() -> None:
    sources = package_sources()
    assert RUNNER in sources  # the walk found the runner
    assert violations(sources) == []


def test_the_runner_starts_processes_itself() -> None:
    """What the guard's list names is what the runner does use (the list is not stale)."""
    assert "subprocess.Popen" in {name for _, name in uses(package_sources()[RUNNER])}


def test_each_allowance_is_still_needed() -> None:
    sources = package_sources()
    for module, name in ALLOWED:
        assert name in {found for _, found in uses(sources[module])}, (module, name)


def test_a_generated_scripts_text_is_no_call_but_its_code_would_be() -> None:
    """kubetrain/render/script.py holds ``os.execvp(...)`` in the text of a script it writes
    for the pod: a string, which the guard passes; the same words as code are caught."""
    module = "kubetrain.render.script"
    source = package_sources()[module]
    assert "os.execvp(" in source
    assert violations({module: source}) == []
    planted = "import os, sys\n\nos.execvp(sys.argv[2], sys.argv[2:])\n"
    assert violations({module: planted}) == [f"{module}:3: os.execvp"]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import subprocess\n\nsubprocess.run(['x'])\n", "subprocess.run"),
        ("import subprocess\n\ndef f():\n    subprocess.Popen(['x'])\n", "subprocess.Popen"),
        ("from subprocess import check_output as co\n\nco(['x'])\n", "subprocess.check_output"),
        ("import subprocess as sp\n\nsp.call(['x'])\n", "subprocess.call"),
        ("import subprocess\n\nstart = subprocess.check_call\n", "subprocess.check_call"),
        ("import subprocess\n\ngetattr(subprocess, 'Popen')(['x'])\n", "subprocess.Popen"),
        ("import os\n\nos.system('x')\n", "os.system"),
        ("import os\n\nos.popen('x')\n", "os.popen"),
        ("import os\n\nif os.fork() == 0:\n    pass\n", "os.fork"),
        ("import os\n\nos.forkpty()\n", "os.forkpty"),
        ("from os import execve\n\nexecve('/bin/x', ['x'], {})\n", "os.execve"),
        ("import os\n\nos.spawnlp(os.P_NOWAIT, 'x', 'x')\n", "os.spawnlp"),
        ("import os\n\nos.posix_spawnp('x', ['x'], {})\n", "os.posix_spawnp"),
        ("import pty\n\npty.spawn(['sh'])\n", "pty.spawn"),
        (
            "import asyncio\n\nasync def f():\n    await asyncio.create_subprocess_exec('x')\n",
            "asyncio.create_subprocess_exec",
        ),
        (
            "from asyncio import create_subprocess_shell\n\ncreate_subprocess_shell('x')\n",
            "asyncio.create_subprocess_shell",
        ),
        (
            "import multiprocessing\n\nmultiprocessing.Process(target=f)\n",
            "multiprocessing.Process",
        ),
        ("from multiprocessing import Pool\n\nPool(2)\n", "multiprocessing.Pool"),
        (
            "import torch.multiprocessing as mp\n\nmp.spawn(f, nprocs=2)\n",
            "torch.multiprocessing.spawn",
        ),
        (
            "from concurrent.futures import ProcessPoolExecutor\n\nProcessPoolExecutor()\n",
            "concurrent.futures.ProcessPoolExecutor",
        ),
    ],
)
def test_a_process_started_outside_the_runner_is_caught(source: str, expected: str) -> None:
    module = "kubetrain.components.evaluate_model.evaluate"
    found = violations({module: source})
    assert any(line.startswith(f"{module}:") and line.endswith(f": {expected}") for line in found)


def test_the_runners_own_starts_and_harmless_uses_pass() -> None:
    sources = {
        RUNNER: "import subprocess\n\nsubprocess.Popen(['x'])\n",
        "kubetrain.backends.local.supervisor": (
            "import subprocess\n\n"
            "def f(processes: list[subprocess.Popen]) -> subprocess.Popen:\n"
            "    x: subprocess.Popen = processes[0]\n"
            "    return start(['x'], stdin=subprocess.DEVNULL, stderr=subprocess.STDOUT)\n"
        ),
        "kubetrain.cli.run": (
            "import os\n\nos.kill(pid, 15)\nos.waitpid(pid, os.WNOHANG)\n"
            "TEXT = 'subprocess.run([\"x\"])'\n"
        ),
    }
    assert violations(sources) == []
