"""`kubetrain --help` and every subcommand's help explain each option."""

from __future__ import annotations

import argparse
import subprocess
import sys

from kubetrain.cli import build_parser


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_every_option_of_every_subcommand_has_help():
    commands = subcommands()
    assert {
        "prep",
        "launch",
        "wait",
        "collect",
        "evaluate",
        "logs",
        "delete",
        "run",
        "compile",
    } <= set(commands)
    missing = [
        f"{name} {action.dest}"
        for name, sub in commands.items()
        for action in sub._actions
        if not isinstance(action, argparse._HelpAction) and not (action.help or "").strip()
    ]
    assert missing == []
    assert all((sub.description or "").strip() for sub in commands.values())


def test_help_runs_without_importing_torch_or_kfp():
    probe = (
        "import sys; from kubetrain.cli import build_parser; build_parser(); "
        "print(sorted(m for m in ('torch', 'kfp', 'numpy') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert result.stdout.strip() == "[]", result.stderr
    help_text = subprocess.run(
        [sys.executable, "-m", "kubetrain", "--help"], capture_output=True, text=True
    )
    assert help_text.returncode == 0 and "launch" in help_text.stdout
