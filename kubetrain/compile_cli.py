"""`kubetrain compile`: write the components' and the pipeline's KFP YAML."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "compile",
        help="write each component's YAML, the KFP pipeline's IR and the Argo workflows' YAML",
        description=(
            "Compile each step's KFP component to components/<step>/component.yaml (loadable with "
            "kfp.components.load_component_from_file) and the pipeline to "
            "pipelines/compiled/training_pipeline.yaml (for `kfp run create`), and the Argo "
            "Workflow and WorkflowTemplate to pipelines/compiled/training_workflow.yaml (for "
            "`argo submit`) and training_workflow_template.yaml (for `argo template create`)."
        ),
    )
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=None,
        help="write under DIR/components and DIR/pipelines instead of next to the sources",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from kubetrain.compile import compile_all

    if args.output_dir is not None:
        written = compile_all(args.output_dir / "components", args.output_dir / "pipelines")
    else:
        written = compile_all()
    for path in written:
        print(f"wrote {path}")
    return 0
