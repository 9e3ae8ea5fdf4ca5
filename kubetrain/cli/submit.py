"""`kubetrain submit kfp|argo`: run the compiled pipeline on a Kubeflow Pipelines server, or
the training workflow on an Argo Server (through Hera's ``WorkflowsService``)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from kubetrain import rules
from kubetrain.cli import submit_argo
from kubetrain.cli.param_option import check_value, split_param
from kubetrain.cli.submit_argo import MAX_PACKAGE_BYTES
from kubetrain.errors import InvalidInput, KubetrainError, reading
from kubetrain.user_files import read_user_file


# How a pipeline parameter's declared type turns a command-line string into its value.
def _json_of(kind: type) -> Callable[[str], object]:
    """A KFP LIST or STRUCT parameter from JSON text (``-p command='["torchrun", "x.py"]'``)."""

    def parse(text: str) -> object:
        value = json.loads(text)
        if not isinstance(value, kind):
            raise ValueError(text)
        return value

    return parse


PARAMETER_PARSERS: dict[str, Callable[[str], object]] = {
    "NUMBER_INTEGER": int,
    "NUMBER_DOUBLE": float,
    "STRING": str,
    "BOOLEAN": lambda text: {"true": True, "false": False}[text.lower()],
    "LIST": _json_of(list),
    "STRUCT": _json_of(dict),
}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "submit",
        help="run the pipeline on a Kubeflow Pipelines server or an Argo Server",
        description=(
            "Submit the compiled pipeline to an orchestrator and print the run's id (KFP) or "
            "the workflow's name (Argo)."
        ),
    )
    targets = parser.add_subparsers(
        dest="target",
        metavar="TARGET",
        required=True,
        help="kfp: a Kubeflow Pipelines server; argo: an Argo Workflows server",
    )
    kfp = targets.add_parser(
        "kfp",
        help="create a run on a Kubeflow Pipelines server",
        description=(
            "Create a run of pipelines/compiled/training_pipeline.yaml on a KFP server (the "
            "same as `kfp run create`), with parameters checked against the pipeline's."
        ),
    )
    kfp.add_argument("--host", required=True, help="KFP API endpoint, e.g. http://localhost:8080")
    kfp.add_argument(
        "--namespace", default=None, help="KFP profile namespace (multi-user installs)"
    )
    kfp.add_argument("--experiment", default="kubetrain", help="experiment name; default kubetrain")
    kfp.add_argument("--run-name", default=None, help="run name; default pipeline name + time")
    kfp.add_argument(
        "--service-account",
        default="",
        metavar="NAME",
        # KFP's default account (kubeflow/pipelines 2.17.0 backend/src/apiserver/common/
        # const.go; default-editor from multi-user/api-service/params.env) has nothing in
        # trainer.kubeflow.org (pipeline-runner-role.yaml) but what `render rbac` binds to it,
        # and has what KFP's launcher reads in every step pod, which our kubetrain account lacks.
        help="ServiceAccount the run's steps run as; default the KFP server's (pipeline-runner, "
        "default-editor in a multi-user profile), which `kubetrain render rbac` binds to the "
        "TrainJob rights. Another account needs those (`kubetrain render rbac "
        "--service-account NAME`) and what KFP's own launcher reads in each step pod: its "
        "artifact-store Secret and the kfp-launcher ConfigMap (kubeflow/pipelines 2.17.0 "
        "backend/src/v2/objectstore/object_store.go, config/env.go), which pipeline-runner has",
    )
    kfp.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="pipeline parameter, e.g. --param nodes=4 --param strategy=fsdp; repeatable",
    )
    kfp.add_argument(
        "--package",
        type=Path,
        default=None,
        help="compiled pipeline YAML; default the installed training_pipeline.yaml",
    )
    kfp.set_defaults(handler=run_kfp)
    submit_argo.register(targets)


def pipeline_parameters(package: Path) -> dict[str, str]:
    """Name → declared type of the compiled pipeline's input parameters."""
    import yaml

    data = read_user_file(package, "--package", MAX_PACKAGE_BYTES, "run `kubetrain compile`")
    with reading(package):  # a corrupt or foreign package is one line naming it
        spec = next(yaml.safe_load_all(data.decode()))
        parameters = spec["root"].get("inputDefinitions", {}).get("parameters", {})
        return {name: p["parameterType"] for name, p in parameters.items()}


def parse_arguments(pairs: list[str], declared: dict[str, str]) -> dict[str, object]:
    arguments: dict[str, object] = {}
    for pair in pairs:
        name, text = split_param(pair, declared, "pipeline")
        try:
            arguments[name] = PARAMETER_PARSERS[declared[name]](text)
        except (KeyError, ValueError):
            raise InvalidInput(
                f"--param {name}", f"{text!r} is not a {declared[name].lower()}",
                "give a value of the parameter's type",
            ) from None  # fmt: skip
        check_value(name, arguments[name], f"--param {name}")
    return arguments


def run_kfp(args: argparse.Namespace) -> int:
    from kubetrain.backends.http_clients import ServerSilent, http_timeout, kfp_client
    from kubetrain.cli.compile import package_dir

    package = args.package or package_dir("kubetrain.pipelines") / "compiled" / (
        "training_pipeline.yaml"
    )
    # Everything is checked before the KFP client is made: it contacts the server at once.
    if args.namespace is not None:
        rules.namespace(args.namespace, "--namespace")
    if args.service_account:
        rules.dns1123_subdomain(
            args.service_account,
            "--service-account",
            "give a ServiceAccount's name, e.g. kubetrain",
        )
    arguments = parse_arguments(args.param, pipeline_parameters(package))
    http_timeout()  # a bad KUBETRAIN_HTTP_TIMEOUT_SECONDS is refused here, as bad input
    try:
        client = kfp_client(args.host, args.namespace)
        result = client.create_run_from_pipeline_package(
            str(package),
            arguments=arguments,
            run_name=args.run_name,
            experiment_name=args.experiment,
            namespace=args.namespace,
            # empty: none sent, so the server picks its default (backend/src/apiserver/
            # template/template.go setDefaultServiceAccount)
            service_account=args.service_account or None,
        )
    except ServerSilent as exc:
        raise KubetrainError(f"could not create the run: {exc}") from None
    except Exception as exc:  # the KFP client raises many kinds; report them as one line
        raise KubetrainError(f"could not create the run on {args.host}: {exc}") from exc
    print(f"run {result.run_id} created on {args.host}")
    print(result.run_id)
    return 0
