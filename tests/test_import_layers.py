"""The package's layers, written down as a test (like kubeflow/pipelines-components' import
guard): each layer imports only layers below it, and only the CLI layer reaches up into the
steps and pipelines it hosts. Imports are read from the source (ast), so an import inside a
function counts as much as one at the top."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

#: Layers from the bottom up; a module may import its own layer and the ones before it.
LAYERS = (
    "foundations",  # kubetrain/*.py: errors, the job spec, validation rules, names, images
    "storage",  # kubetrain/storage: URLs, verified copy, atomic publishing, integrity
    "artifacts",  # kubetrain/artifacts: dataset, checkpoint and model formats
    "render",  # kubetrain/render: the job spec as Kubernetes objects
    "train",  # kubetrain/train: our DDP/FSDP trainer
    "backends",  # kubetrain/backends: local processes, the Kubernetes API
    "step plumbing",  # components/_shared: what every step's faces share
    "steps",  # components/<step>
    "pipelines",  # pipelines/: the KFP pipeline and the Argo workflow
    "cli",  # kubetrain/cli: the program's own verbs
)
#: Layers that run without a cluster client or a pipeline SDK.
NO_ORCHESTRATION = ("foundations", "storage", "artifacts", "render", "train")
ORCHESTRATION_PACKAGES = ("kfp", "hera", "kubernetes")
#: The ``__main__`` of the package is the console script's other door, part of the CLI.
CLI_MODULES = ("kubetrain.__main__",)
#: A string naming a kubetrain module, as ``importlib.import_module`` takes it.
DOTTED_NAME = re.compile(r"kubetrain(\.[A-Za-z_][A-Za-z0-9_]*)+")


def layer_of(module: str) -> str | None:
    """The layer a kubetrain module (dotted name) belongs to; None for anything else."""
    parts = module.split(".")
    if parts[0] != "kubetrain":
        return None
    if module in CLI_MODULES:
        return "cli"
    if len(parts) == 1:
        return "foundations"
    top = parts[1]
    if top == "components":
        return "step plumbing" if parts[2:3] == ["_shared"] else "steps"
    if top in ("storage", "artifacts", "render", "train", "backends", "pipelines", "cli"):
        return top
    return "foundations"


def is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def module_name(path: Path) -> str:
    """The dotted name a source file is installed as (components/, pipelines/ and runtimes/ are
    mapped onto kubetrain.components / .pipelines / .runtimes, as pyproject.toml says)."""
    relative = path.relative_to(REPO_ROOT).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts.pop()
    if parts[0] in ("components", "pipelines", "runtimes"):
        parts.insert(0, "kubetrain")
    return ".".join(parts)


def imported_modules(source: str, module: str, package: bool = False) -> Iterable[str]:
    """Every module an ``import`` or ``from ... import`` names, at any depth of the file, and
    every dotted ``kubetrain.…`` name a string holds (``importlib.import_module("…")``).
    ``package``: the source is the module's ``__init__.py`` (relative imports start there)."""
    anchor_package = module if package else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and DOTTED_NAME.fullmatch(node.value)
        ):
            yield node.value
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = anchor_package.split(".")
                anchor = parts[: len(parts) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            yield base
            # ``from kubetrain import storage`` names a module of another layer than its parent.
            yield from (
                f"{base}.{alias.name}"
                for alias in node.names
                if layer_of(f"{base}.{alias.name}") != layer_of(base)
            )


def step_of(module: str) -> str | None:
    """The step folder a module belongs to (``kubetrain.components.<step>...``)."""
    parts = module.split(".")
    return parts[2] if parts[:2] == ["kubetrain", "components"] and len(parts) > 2 else None


def violations(sources: dict[str, str], packages: frozenset[str] = frozenset()) -> list[str]:
    """Each forbidden import in ``sources`` (module name -> source; ``packages`` names those
    read from an ``__init__.py``), as one readable line. A step imports no other step: what
    two steps share belongs in ``components/_shared``."""
    found = []
    for module, source in sorted(sources.items()):
        layer = layer_of(module)
        if layer is None:
            continue
        rank = LAYERS.index(layer)
        for imported in sorted(set(imported_modules(source, module, module in packages))):
            if imported == module:
                continue
            target = layer_of(imported)
            top_package = imported.split(".")[0]
            if target is not None and LAYERS.index(target) > rank:
                found.append(f"{module} ({layer}) imports {imported} ({target})")
            elif layer in NO_ORCHESTRATION and top_package in ORCHESTRATION_PACKAGES:
                found.append(f"{module} ({layer}) imports {imported}")
            elif layer == target == "steps" and step_of(imported) not in (None, step_of(module)):
                found.append(f"{module} (step {step_of(module)}) imports {imported}")
    return found


def package_files() -> list[Path]:
    """Every module the wheel installs (component tests excluded)."""
    files = [
        *(REPO_ROOT / "kubetrain").rglob("*.py"),
        *(REPO_ROOT / "components").rglob("*.py"),
        *(REPO_ROOT / "pipelines").rglob("*.py"),
    ]
    return [path for path in files if "tests" not in path.relative_to(REPO_ROOT).parts]


def package_sources() -> dict[str, str]:
    """Every module the wheel installs, by dotted name."""
    return {module_name(path): path.read_text() for path in package_files()}


PACKAGES = frozenset(module_name(path) for path in package_files() if is_package(path))


def test_every_module_keeps_to_its_layer() -> None:
    sources = package_sources()
    assert "kubetrain.backends.kubernetes.backend" in sources  # the walk found the tree
    assert violations(sources, PACKAGES) == []


def test_only_the_cli_layer_imports_components_or_pipelines() -> None:
    reaching_up = [
        f"{module} imports {imported}"
        for module, source in package_sources().items()
        if module.startswith("kubetrain.")
        and layer_of(module) not in ("step plumbing", "steps", "pipelines", "cli")
        for imported in imported_modules(source, module, module in PACKAGES)
        if imported.startswith(("kubetrain.components", "kubetrain.pipelines"))
    ]
    assert reaching_up == []


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        # a backend reaching up into a step, lazily inside a function
        (
            "kubetrain.backends.local.backend",
            "def f():\n    from kubetrain.components.launch_trainjob import launch\n",
            "kubetrain.backends.local.backend (backends) imports "
            "kubetrain.components.launch_trainjob (steps)",
        ),
        # a step importing the CLI layer
        (
            "kubetrain.components.wait_trainjob.cli",
            "from kubetrain.cli.jobs import backend_options\n",
            "kubetrain.components.wait_trainjob.cli (steps) imports kubetrain.cli.jobs (cli)",
        ),
        # the artifact formats needing a cluster client
        (
            "kubetrain.artifacts.checkpoint",
            "import kubernetes.client\n",
            "kubetrain.artifacts.checkpoint (artifacts) imports kubernetes.client",
        ),
        # a foundation module importing a pipeline SDK, named through its parent package
        (
            "kubetrain.rules",
            "from kfp import dsl\n",
            "kubetrain.rules (foundations) imports kfp",
        ),
        # a package's __init__ reaching up relatively (its own package is the anchor)
        (
            "kubetrain.backends",
            "from ..components.launch_trainjob import launch\n",
            "kubetrain.backends (backends) imports kubetrain.components.launch_trainjob (steps)",
        ),
        # a module named in a string, as importlib.import_module takes it
        (
            "kubetrain.render",
            'MODULE = "kubetrain.pipelines.training_pipeline"\n',
            "kubetrain.render (render) imports kubetrain.pipelines.training_pipeline (pipelines)",
        ),
        # the shared step plumbing importing a step
        (
            "kubetrain.components._shared.argo_steps",
            "from kubetrain.components.collect_checkpoint import collect\n",
            "kubetrain.components._shared.argo_steps (step plumbing) imports "
            "kubetrain.components.collect_checkpoint (steps)",
        ),
        # one step importing another
        (
            "kubetrain.components.evaluate_model.evaluate",
            "from kubetrain.components.collect_checkpoint.collect import collect_checkpoint\n",
            "kubetrain.components.evaluate_model.evaluate (step evaluate_model) imports "
            "kubetrain.components.collect_checkpoint.collect",
        ),
        # storage reaching into the artifact formats, relatively
        (
            "kubetrain.storage.verified_copy",
            "from ..artifacts import manifest\n",
            "kubetrain.storage.verified_copy (storage) imports kubetrain.artifacts (artifacts)",
        ),
    ],
)
def test_a_forbidden_import_is_caught(module: str, source: str, expected: str) -> None:
    sources = {**package_sources(), module: source}
    assert expected in violations(sources, PACKAGES)


def test_allowed_imports_pass() -> None:
    sources = {
        "kubetrain.cli.run": "from kubetrain.pipelines.training_pipeline import x\n",
        "kubetrain.components.collect_checkpoint.collect": "from kubetrain.artifacts import x\n",
        "kubetrain.backends.kubernetes.backend": "import kubernetes.client\n",
        "kubetrain.train.trainer": "import torch\nfrom kubetrain.artifacts import checkpoint\n",
    }
    assert violations(sources) == []


#: Optional extras imported only inside the functions that use them, never when a module loads:
#: the light install, `--help` and a RayJob's entrypoint parsing its options run without them.
LAZY_PACKAGES = ("ray",)


def eager_imports(source: str) -> list[str]:
    """The :data:`LAZY_PACKAGES` modules ``source`` imports outside any function (at the top
    level, or in a class body or ``if``/``try`` block that runs on import)."""
    found = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                continue
            if isinstance(child, ast.Import):
                found.extend(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and not child.level and child.module:
                found.append(child.module)
            visit(child)

    visit(ast.parse(source))
    return [name for name in found if name.split(".")[0] in LAZY_PACKAGES]


def test_ray_is_imported_only_where_it_runs() -> None:
    eager = {
        module: names
        for module, source in package_sources().items()
        if (names := eager_imports(source))
    }
    assert eager == {}
    assert eager_imports("import ray\n") == ["ray"]
    assert eager_imports("try:\n    from ray.train import report\nexcept ImportError:\n    pass\n")
    assert eager_imports("def f():\n    import ray.train\n") == []
    assert eager_imports("from kubetrain.train import ray\n") == []  # our module, not Ray


def test_the_package_keeps_few_top_level_modules_and_ships_no_test_harness() -> None:
    """At most 12 modules at the top of kubetrain/ (the rest lives in subpackages by concern),
    every package folder is in the wheel, and no test support is."""
    import tomllib

    top_level = sorted(path.name for path in (REPO_ROOT / "kubetrain").glob("*.py"))
    assert len(top_level) <= 12, top_level
    packaged = set(
        tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    folders = {
        module_name(init)
        for root in ("kubetrain", "components", "pipelines", "runtimes")
        for init in (REPO_ROOT / root).rglob("__init__.py")
        if "tests" not in init.relative_to(REPO_ROOT).parts
    }
    assert packaged == folders
    assert not [name for name in packaged if "test" in name]
    assert not (REPO_ROOT / "kubetrain" / "testing").exists()
