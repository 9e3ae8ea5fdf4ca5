"""`kubetrain submit kfp|argo`: run the compiled pipeline on a Kubeflow Pipelines server, or
the training workflow on an Argo Server (through Hera's ``WorkflowsService``)."""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import NamedTuple

from kubetrain import bounded_json, rules
from kubetrain.cli import submit_argo
from kubetrain.cli.param_option import (
    check_elastic_values,
    check_launcher,
    check_value,
    split_param,
)
from kubetrain.cli.submit_argo import MAX_PACKAGE_BYTES
from kubetrain.errors import InvalidInput, KubetrainError, reading, terminal_text
from kubetrain.user_files import read_user_file


# How a pipeline parameter's declared type turns a command-line string into its value.
def _json_of(kind: type) -> Callable[[str], object]:
    """A KFP LIST or STRUCT parameter from JSON text (``-p command='["torchrun", "x.py"]'``)."""

    def parse(text: str) -> object:
        value = bounded_json.loads(text)
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


class Declared(NamedTuple):
    """A pipeline input parameter: its declared type and default (None: it has none)."""

    kind: str
    default: object = None


def pipeline_parameters(package: Path) -> dict[str, Declared]:
    """Name → declared type and default of the compiled pipeline's input parameters."""
    import yaml

    data = read_user_file(package, "--package", MAX_PACKAGE_BYTES, "run `kubetrain compile`")
    with reading(package):  # a corrupt or foreign package is one line naming it
        spec = next(yaml.safe_load_all(data.decode()))
        parameters = spec["root"].get("inputDefinitions", {}).get("parameters", {})
        return {
            name: Declared(p["parameterType"], p.get("defaultValue"))
            for name, p in parameters.items()
        }


def parse_arguments(pairs: list[str], declared: dict[str, Declared]) -> dict[str, object]:
    arguments: dict[str, object] = {}
    for pair in pairs:
        name, text = split_param(pair, declared, "pipeline")
        kind = declared[name].kind
        try:
            arguments[name] = PARAMETER_PARSERS[kind](text)
        except (KeyError, ValueError):
            raise InvalidInput(
                f"--param {name}", f"{text!r} is not a {kind.lower()}",
                "give a value of the parameter's type",
            ) from None  # fmt: skip
        check_value(name, arguments[name], f"--param {name}")
    return arguments


def check_run_parameters(values: Mapping[str, object]) -> None:
    """Refuse what the prep and launch steps would refuse in the values a run is sent (given
    with --param, else the pipeline's defaults), before the server is contacted: found by a
    step, a bad value fails the run after the steps before it ran. ``command`` is a list (the
    KFP pipeline's LIST) or JSON text (the Argo parameter, which launch reads as
    ``--command-json``)."""
    from kubetrain.cli.run import check_program_model
    from kubetrain.components._shared.program import check_program_text, parse_command
    from kubetrain.components.launch_trainjob.launch import text_list
    from kubetrain.jobspec import TrainJobSpec, refuse_rank_starter
    from kubetrain.render import launcher_for

    check_launcher(values, lambda name: f"--param {name}")
    field = "--param command"
    value = values.get("command")
    if isinstance(value, str):
        command = parse_command(value, field)
    else:
        command = tuple(text_list(value, field))
    if command:
        # the launch step's checks of a program (plan_launch): its text can reach argv (no
        # NUL byte), and the job spec it makes names one (TrainJobSpec.validate)
        check_program_text(command, field)
        TrainJobSpec(name="program", command=command[:1], args=command[1:]).validate()
        launcher = str(values.get("launcher", "torchrun"))
        backend = str(values.get("backend", "trainer"))  # the launch step's default
        refuse_rank_starter(list(command), launcher_for(launcher, backend), field)
        check_program_model(command, values.get("model"), "--param model")
    if "dataset_source" in values:
        check_dataset_source(str(values["dataset_source"]), "--param dataset_source")
    check_elastic_values(values, lambda name: f"--param {name}", own_program=bool(command))


def check_dataset_source(source: str, field: str) -> None:
    """prep's rule for its source (``check_source``), but a path: that is one on the prep
    step's pod, which need not exist here."""
    from kubetrain.components.dataset_prep.prep import check_source

    scheme, sep, _ = source.partition(":")
    is_path = bool(source.strip()) and (
        not sep or scheme.lower() == "file" or source.startswith(("/", ".", "~"))
    )
    if not is_path:
        check_source(source, field)


@contextlib.contextmanager
def client_logs_kept() -> Iterator[list[logging.LogRecord]]:
    """Keep what the KFP client logs instead of printing it: it logs each failed attempt to
    reach the server's healthz with its traceback (kfp 2.17.3 kfp/client/client.py
    ``get_kfp_healthz``: ``logging.exception``, 5 attempts; the first one installs a stderr
    handler on the root logger), and urllib3 its retries; the failure is then one line. Its
    warning that it needs a v2 server (kfp/client/client.py ``Client.__init__``), which our
    pipeline needs anyway, is not shown."""
    kept: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            kept.append(record)

    root = logging.getLogger()
    handlers = root.handlers[:]
    root.handlers[:] = [Keep()]
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "This client only works", FutureWarning)
            yield kept
    finally:
        root.handlers[:] = handlers


def last_logged_failure(records: list[logging.LogRecord]) -> str:
    """What the last kept record with an exception says, as a clause of the error line (empty
    when none): the server's answer to the last attempt (KFP's ApiException has its status)."""
    failures = [record.exc_info[1] for record in records if record.exc_info]
    if not failures:
        return ""
    last = failures[-1]
    status, reason = getattr(last, "status", None), getattr(last, "reason", None)
    said = f"{status} {reason}" if status else f"{type(last).__name__}: {str(last)[:200]}"
    return f" (the last attempt: {' '.join(said.split())})"


def run_kfp(args: argparse.Namespace) -> int:
    from kubetrain.backends.http_clients import http_timeout, kfp_client
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
    declared = pipeline_parameters(package)
    arguments = parse_arguments(args.param, declared)
    defaults = {name: p.default for name, p in declared.items() if p.default is not None}
    check_run_parameters({**defaults, **arguments})
    http_timeout()  # a bad KUBETRAIN_HTTP_TIMEOUT_SECONDS is refused here, as bad input
    try:
        # the client prints its links (kfp/client/client.py create_experiment, run_pipeline:
        # "Run details: URL"), server ids in them; held until the run id is checked
        with client_logs_kept() as logged, contextlib.redirect_stdout(io.StringIO()) as links:
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
    except KubetrainError as exc:  # silent, or an answer no client can read: names the server
        raise KubetrainError(
            f"could not create the run: {exc}{last_logged_failure(logged)}"
        ) from None
    except Exception as exc:  # the KFP client raises many kinds; report them as one line
        raise KubetrainError(
            f"could not create the run on {args.host}: {exc}{last_logged_failure(logged)}; "
            "check that --host names the KFP API (e.g. http://localhost:8080 through `kubectl "
            "port-forward -n kubeflow svc/ml-pipeline-ui 8080:80`) and that its server is up"
        ) from exc
    if not isinstance(result.run_id, str) or not result.run_id.strip():
        # an answer with no run id (a proxy's or another service's {}) confirms no run
        raise KubetrainError(
            f"the KFP API at {args.host} answered the run's creation with no run id "
            f"(run_id={result.run_id!r}); check that --host names the KFP API, not a proxy or "
            "another service, and look for the run in its UI before submitting again"
        )
    for link in links.getvalue().splitlines():
        print(terminal_text(link))
    # the run id is the server's text, the host the user's
    print(terminal_text(f"run {result.run_id} created on {args.host}"))
    print(terminal_text(str(result.run_id)))
    return 0
