"""`kubetrain run`: the whole pipeline on this machine, through KFP's own local runner, with the
local backend playing Kubeflow Trainer (real multi-process training)."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kubetrain import bounded_json
from kubetrain.backends.base import BACKENDS
from kubetrain.cli.run_output import RunOutput, colour_wanted, kfp_output_shaped
from kubetrain.errors import InvalidInput, JobNotFound, KubetrainError, terminal_text
from kubetrain.jobspec import AUTO_PROCS, resolve_nodes, resolve_procs_per_node
from kubetrain.rules import BUILTIN_MODELS, DEFAULT_ZERO_STAGE, LAUNCHERS, STRATEGIES, ZERO_STAGES


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run the whole pipeline on this machine (KFP local runner + local backend)",
        description=(
            "Run prep → launch → wait → collect → evaluate → promote (when the model passes) "
            "with KFP's local runner; the training job runs as real processes, one torchrun per "
            "node, with the PET_* environment Kubeflow Trainer would inject, or with --backend "
            "trainer|pytorchjob|job|rayjob on your kubeconfig's cluster. Ends with a summary: test "
            "accuracy, time, and where the model, metrics and promoted model are."
        ),
    )
    parser.add_argument(
        "--dataset",
        default="sklearn:digits",
        help="dataset source (see `kubetrain prep --help`); default sklearn:digits",
    )
    parser.add_argument(
        "--nodes",
        default="2",
        metavar="N|MIN:MAX",
        help="training nodes; MIN:MAX runs an elastic job that goes on while at least MIN "
        "nodes remain (backends local and pytorchjob; needs --max-restarts); default 2",
    )
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        help="after a node fails, restart every node up to N times, resuming from the newest "
        "checkpoint; with --nodes MIN:MAX torchrun's --max-restarts (each lost or joining node "
        "restarts the others at the new size); default 0",
    )
    parser.add_argument(
        "--procs-per-node",
        default=AUTO_PROCS,
        metavar="N|auto",
        help="training processes per node; default auto: one per GPU, and kubetrain run's "
        "nodes ask for none, so 1",
    )
    parser.add_argument(
        "--launcher",
        default="torchrun",
        choices=LAUNCHERS,
        help="what starts the processes: torchrun on every node (default); mpi: mpirun "
        "starts --procs-per-node ranks on every node from a hostfile, as Kubeflow Trainer's "
        "MPI runtime does (backends local and trainer; give --procs-per-node a number), your "
        "program after -- is then one rank's, e.g. `-- python train.py`; ray: a Ray head and "
        "--nodes Ray worker nodes on this machine run the job as a KubeRay RayJob would (our "
        "trainer as Ray Train's TorchTrainer, or your Ray script after --); --backend rayjob "
        "runs ray on the cluster",
    )
    parser.add_argument(
        "--strategy",
        default="ddp",
        choices=STRATEGIES,
        help="data-parallel strategy: ddp, fsdp (FSDP2) or deepspeed (ZeRO); default ddp",
    )
    parser.add_argument(
        "--zero-stage",
        type=int,
        default=DEFAULT_ZERO_STAGE,
        choices=ZERO_STAGES,
        metavar="1|2|3",
        help="with --strategy deepspeed: the ZeRO stage, what the ranks shard (1: optimizer "
        "state, 2: and gradients, 3: and parameters); default 2",
    )
    parser.add_argument(
        "--deepspeed-config",
        default="",
        metavar="FILE|JSON",
        help="with --strategy deepspeed: your DeepSpeed config, a JSON file or its JSON text; "
        "its settings win, ours (--zero-stage, --batch-size, --lr...) fill what it leaves out",
    )
    parser.add_argument(
        "--model",
        default="mlp",
        help="mlp, cnn or package.module:callable (callable(sample_shape, num_classes) -> "
        "nn.Module, importable from this folder); with your own program, the factory collect "
        "and evaluate rebuild your model with",
    )
    parser.add_argument(
        "--script",
        default="",
        metavar="FILE",
        help="your training script, shipped with the job (on a cluster; here the nodes read it "
        "where it is), e.g. --script train.py -- torchrun train.py",
    )
    parser.add_argument("--epochs", type=int, default=10, help="training epochs; default 10")
    parser.add_argument(
        "--keep-checkpoints",
        type=int,
        default=3,
        metavar="N",
        help="epoch checkpoints our trainer keeps, the newest (never LATEST's); 0 keeps all; "
        "default 3",
    )
    parser.add_argument("--lr", type=float, default=0.001, help="learning rate; default 0.001")
    parser.add_argument(
        "--batch-size", type=int, default=32, help="batch size per process; default 32"
    )
    parser.add_argument(
        "--threshold",
        type=float,
        default=0.95,
        help="accuracy the model must reach to pass; default 0.95",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the train/test split; default 0"
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=Path("runs"),
        help="folder for the run's artifacts (KFP pipeline root); default ./runs",
    )
    parser.add_argument(
        "--registry",
        default=None,
        metavar="DIR|URL",
        help="model registry a passing model is promoted into (as version <run>): a folder, "
        "file:// or fsspec URL (s3://bucket/models); default OUTPUT/registry",
    )
    parser.add_argument(
        "--backend",
        default="local",
        choices=BACKENDS,
        help="where the training job runs while the steps run here: local (processes on this "
        "machine, default), or on the cluster of your kubeconfig as a TrainJob (trainer), a "
        "PyTorchJob (pytorchjob), an Indexed Job (job) or a KubeRay RayJob (rayjob), which "
        "needs --storage its pods reach",
    )
    parser.add_argument(
        "--namespace",
        default="",
        help="the cluster backends' namespace; default: the kubeconfig context's",
    )
    parser.add_argument(
        "--image",
        default="",
        help="the cluster backends' image (with kubetrain and your code); default: ours",
    )
    parser.add_argument(
        "--storage-secret",
        default="",
        metavar="NAME",
        help="the cluster backends' Secret with the object storage's AWS_* keys, given to the "
        "job's pods as env by reference; default none (the cluster's workload identity)",
    )
    parser.add_argument(
        "--storage",
        default="",
        metavar="URL",
        help="object storage (e.g. s3://bucket/prefix) for the dataset, checkpoints and model, "
        "under URL/{datasets,checkpoints,models}/<run>; endpoint and keys from AWS_ENDPOINT_URL, "
        "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION; default: local folders",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=0,
        help="fail the wait step after this many seconds; default 0 = none",
    )
    parser.add_argument(
        "--stall-timeout",
        default="auto",
        help="stop the training job when it logs nothing for this many seconds while running "
        "(a hung rank); 0 = never; default auto: 5 times the heartbeat our trainer states "
        "(5 min), else 1800",
    )
    parser.add_argument(
        "--keep-job",
        action="store_true",
        help="keep the training job's folder (its checkpoints and node logs, under "
        "$KUBETRAIN_LOCAL_ROOT or ~/.kubetrain/local) once the model is collected; default: "
        "removed then (a failed run's is always kept, for its logs)",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="print KFP's local-runner logging and every step's whole output (executor inputs, "
        "outputs, rank 0's kubetrain-progress records as written); default: one line per step "
        "as it starts and ends, the training lines (a live progress bar on a terminal), the "
        "summary",
    )
    parser.add_argument(
        "--state-key",
        default="",
        metavar="KEY",
        help="with your program: the state dict that is your model in a checkpoint of nested "
        "state, as a dotted path (e.g. app.model); collect refuses a checkpoint holding several "
        "that may be the model without it",
    )
    parser.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        help="-- CMD [ARGS...]: your training program instead of our trainer, e.g. "
        "`-- torchrun train.py`, run with your PATH first (your activated venv's torchrun); it "
        "runs in its checkpoint folder, reads $KUBETRAIN_DATA_DIR/train.safetensors (an "
        "absolute path) and saves there (rank 0), e.g. `torch.save(model.module.state_dict(), "
        '"model.pt")`',
    )
    parser.set_defaults(handler=run)


#: (pipeline parameter, argument, option) checked before the pipeline starts.
CHECKED = (
    ("nodes", "nodes", "--nodes"),
    ("max_restarts", "max_restarts", "--max-restarts"),
    ("model", "model", "--model"),
    ("epochs", "epochs", "--epochs"),
    ("keep_checkpoints", "keep_checkpoints", "--keep-checkpoints"),
    ("lr", "lr", "--lr"),
    ("batch_size", "batch_size", "--batch-size"),
    ("seed", "seed", "--seed"),
    ("wait_timeout_seconds", "timeout", "--timeout"),
    ("stall_timeout_seconds", "stall_timeout", "--stall-timeout"),
)


def validate_arguments(args: argparse.Namespace) -> None:
    """Refuse what a step would refuse before the pipeline starts: found by a step, a bad value
    fails the run only after the steps before it have written their outputs."""
    from kubetrain import storage
    from kubetrain.cli.param_option import check_elastic_values, check_launcher, check_value
    from kubetrain.components.dataset_prep.prep import check_source
    from kubetrain.components.evaluate_model.evaluate import validate_threshold
    from kubetrain.components.launch_trainjob.launch import check_model_imports
    from kubetrain.jobspec import refuse_rank_starter
    from kubetrain.render import launcher_for

    for parameter, dest, option in CHECKED:
        check_value(parameter, getattr(args, dest), option)
    resolve_procs_per_node(args.procs_per_node, 0, "--procs-per-node")
    launch_values = {
        "launcher": args.launcher,
        "backend": args.backend,
        "procs_per_node": args.procs_per_node,
        "gpu": 0,  # `kubetrain run`'s nodes ask for none
    }
    check_launcher(launch_values, lambda name: "--" + name.replace("_", "-"))
    if command := program(args):
        refuse_rank_starter(command, launcher_for(args.launcher, args.backend), "command")
    elastic_values = {**launch_values, "nodes": args.nodes, "strategy": args.strategy}
    check_elastic_values(
        elastic_values, lambda name: "--" + name.replace("_", "-"), own_program=bool(program(args))
    )
    deepspeed_config_for_steps(args.deepspeed_config)
    if args.strategy == "deepspeed":
        check_deepspeed(args)
    validate_threshold(args.threshold)
    check_source(args.dataset, "--dataset")
    check_program_model(program(args), args.model, "--model")
    if args.state_key and not program(args):
        raise InvalidInput(
            "--state-key",
            "names the model's state dict in your program's checkpoint; our trainer's has one",
            "drop --state-key, or give your program after --",
        )
    if args.model not in BUILTIN_MODELS:
        check_model_imports(args.model)  # now, not after prep and training
    if args.script and not Path(args.script).is_file():
        raise InvalidInput("--script", f"{args.script} is not a file", "give your script's path")
    if args.storage:
        storage.resolve(args.storage, "--storage")
    if args.backend != "local" and (not args.storage or storage.is_local(args.storage)):
        where = f"{args.storage} is on this machine" if args.storage else "it is not given"
        raise InvalidInput(
            "--storage",
            f"{where}: the dataset, checkpoints and model must be where --backend "
            f"{args.backend}'s pods and this machine both reach them",
            "give object storage, e.g. --storage s3://bucket/runs, and its keys to the pods "
            "with --storage-secret NAME (or the cluster's workload identity)",
        )
    if args.storage_secret:
        check_value("storage_secret", args.storage_secret, "--storage-secret")
    if args.image:
        check_value("image", args.image, "--image")
    if args.namespace:
        check_value("namespace", args.namespace, "--namespace")
    check_locations(args)


def deepspeed_config_for_steps(config: str) -> str:
    """``--deepspeed-config`` as the launch step gets it, the config's JSON text (a file's read
    here: the steps need not run in this folder); a missing file or no config is refused now,
    not by the launch step after prep."""
    from kubetrain.train.deepspeed_config import config_for_nodes

    return config_for_nodes(config, "--deepspeed-config")


def check_deepspeed(args: argparse.Namespace) -> None:
    """What launch checks of a DeepSpeed job (``TrainingOptions.validate_deepspeed``), for the
    one this run makes: the config's batch sizes on nodes x processes, and the checkpoints,
    which go under ``--storage`` when it is given."""
    from kubetrain.artifacts.checkpoint_manifest import refuse_object_storage_for_deepspeed
    from kubetrain.components.launch_trainjob.launch import TrainingOptions

    if args.storage:
        refuse_object_storage_for_deepspeed(args.storage, "--storage")
    options = TrainingOptions(
        strategy=args.strategy,
        zero_stage=args.zero_stage,
        deepspeed_config=args.deepspeed_config,
        batch_size=args.batch_size,
    )
    world_size = resolve_nodes(args.nodes)[1] * resolve_procs_per_node(args.procs_per_node, 0)
    options.validate_deepspeed(world_size)


def check_locations(args: argparse.Namespace) -> None:
    """Every folder the run writes into and the program it starts, checked as the step that
    uses them would, before prep writes anything: found by launch or promote, a bad one fails
    the run after its steps have written (and trained)."""
    import shutil

    from kubetrain import storage
    from kubetrain.backends.local.backend import check_process_cap
    from kubetrain.backends.local.files import ROOT_ENV, local_root
    from kubetrain.backends.local.supervisor import program_path
    from kubetrain.components._shared.step_outputs import check_folder_can_be_made

    check_folder_can_be_made(
        args.output, "--output", "give a folder path that is new or a folder you may write in"
    )
    registry = registry_location(args)
    if storage.is_local(registry):  # promote's rule: a folder, made if missing
        check_folder_can_be_made(
            Path(registry),
            "--registry",
            "give a folder path you may write in, or a URL such as s3://bucket/models",
        )
    if args.storage and storage.is_local(args.storage):
        check_folder_can_be_made(
            storage.local_path(args.storage, "--storage"),
            "--storage",
            "give a folder path you may write in, or a URL such as s3://bucket/runs",
        )
    if args.backend != "local":
        return  # the nodes run on the cluster: the program is the image's, the folders theirs
    check_folder_can_be_made(
        local_root(),
        ROOT_ENV,
        "set it to a folder you may write in (the local jobs' folders go there)",
    )
    # the local backend's rules (LocalBackend.check_launch), which it applies only at launch
    check_process_cap(
        *resolve_nodes(args.nodes, "--nodes"),
        resolve_procs_per_node(args.procs_per_node, 0),
        "--nodes",
    )
    if (command := program(args)) and shutil.which(command[0], path=program_path()) is None:
        raise InvalidInput(
            "command",
            f"{command[0]!r} is not found on PATH",
            "give an installed program or a path to one (it runs with your PATH)",
        )


def check_program_model(command: list[str] | tuple[str, ...], model: object, field: str) -> None:
    """Refuse our trainer's built-in model named for a user's program: collect and evaluate
    rebuild the program's model with ``model``, so a built-in one fails them after training."""
    if command and model in BUILTIN_MODELS:
        raise InvalidInput(
            field,
            f"{model} is our trainer's model, not your program's",
            "give the factory that builds your model (package.module:callable), e.g. netdef:build",
        )


#: The first kfp whose local runner runs a ``dsl.ExitHandler``, which the pipeline has (kfp 2.17
#: kfp/local/pipeline_orchestrator.py has_exit_handler; 2.16's runs no exit task).
LOCAL_EXIT_HANDLER_KFP = (2, 17)


def check_local_runner(kfp_version: str) -> None:
    """Refuse a kfp whose local runner cannot run the pipeline, before any step runs."""
    if tuple(int(part) for part in kfp_version.split(".")[:2]) < LOCAL_EXIT_HANDLER_KFP:
        raise KubetrainError(
            f"kfp {kfp_version}'s local runner cannot run the pipeline's exit handler; "
            "install kfp 2.17: pip install 'kfp>=2.17,<2.18'"
        )


def registry_location(args: argparse.Namespace) -> str:
    """The model registry a passing model is promoted into, as promote reads it: --registry
    (a folder, made absolute, or a URL), else OUTPUT/registry."""
    from kubetrain.components.promote_model.promote import REGISTRY_FORMS, location

    if args.registry is None:
        return str((args.output / "registry").resolve())
    registry = location(args.registry, "--registry", REGISTRY_FORMS, writable=True)
    return str(registry.resolve()) if isinstance(registry, Path) else registry


def program(args: argparse.Namespace) -> list[str]:
    """The user's program given after ``--`` (empty: our trainer)."""
    return args.command[1:] if args.command[:1] == ["--"] else args.command


def run(args: argparse.Namespace) -> int:
    validate_arguments(args)  # before kfp is imported: a refusal is instant
    from importlib import metadata

    check_local_runner(metadata.version("kfp"))
    from kfp import local

    from kubetrain import storage
    from kubetrain.components._shared.program import absolute_location
    from kubetrain.pipelines.training_pipeline import build_training_pipeline

    # Our component image is a Python image; KFP guesses from its name that it may not be.
    # Its steps run as `python3 ...`, for which KFP's local runner puts this interpreter's path
    # (kfp 2.17 kfp/local/subprocess_task_handler.py replace_python_executable), so PATH stays
    # the caller's: a user's program finds their `torchrun` first.
    warnings.filterwarnings("ignore", message=".*non-Python base image", category=RuntimeWarning)
    pipeline_root = args.output.resolve()
    registry = registry_location(args)
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(pipeline_root))
    view = RunOutput(args.verbose, sys.stdout, colour_wanted(sys.stdout))
    started = time.monotonic()
    with (
        stopped_whole_on_interrupt(pipeline_root),
        job_folder_kept(),
        run_resource_name_resolved() as run_names,
        interpreter_put_in_kfp_s_own_command(),
        kfp_output_shaped(view),
    ):
        try:
            build_training_pipeline(args.storage_secret)(
                # local: the job runs here, as processes the launch step starts
                backend=args.backend,
                namespace=args.namespace,
                image=args.image,
                shared_pvc="",  # no claim here: a cluster job reads and writes --storage
                dataset_source=args.dataset,
                seed=args.seed,
                nodes=args.nodes,
                max_restarts=args.max_restarts,
                procs_per_node=args.procs_per_node,
                strategy=args.strategy,
                zero_stage=args.zero_stage,
                deepspeed_config=deepspeed_config_for_steps(args.deepspeed_config),
                launcher=args.launcher,
                model=args.model,
                epochs=args.epochs,
                keep_checkpoints=args.keep_checkpoints,
                lr=float(args.lr),
                batch_size=args.batch_size,
                accuracy_threshold=float(args.threshold),
                model_registry=registry,
                wait_timeout_seconds=float(args.timeout),
                stall_timeout_seconds=str(args.stall_timeout),
                storage=absolute_location(args.storage),
                command=program(args),
                script=str(Path(args.script).absolute()) if args.script else "",
                state_key=args.state_key,
            )
        except RuntimeError as exc:
            run_folders = [pipeline_root / name for name in run_names]
            if kept := kept_job(run_folders):
                job, job_dir = kept
                print(
                    terminal_text(
                        f"the job's node logs and checkpoints stay in {job_dir}; "
                        f"`kubetrain delete {job}` removes them"
                    )
                )
            see_more = how_to_see_more(run_folders)
            fallback = f"pipeline failed: {exc}; to see more: {see_more}"
            raise KubetrainError(view.failure(see_more, fallback)) from exc
    elapsed = time.monotonic() - started
    (run_name,) = run_names
    steps = pipeline_root / run_name
    launched = step_parameters(steps, "launch-trainjob")
    events = tensorboard_events(launched["checkpoint_dir"], steps)
    if args.backend == "local":  # a cluster job's pods and records go with the job
        print(terminal_text(job_folder_outcome(launched["job_name"], args.keep_job)))
    evaluation = step_parameters(steps, "evaluate-model")
    accuracy, passed = evaluation["accuracy"], evaluation["passed"]
    verdict = "passed" if passed else "below threshold"
    training = (
        " ".join(program(args)) if program(args) else f"{args.strategy}, {args.epochs} epochs"
    )
    procs_per_node = resolve_procs_per_node(args.procs_per_node, 0)
    promoted = (steps / "promote-model" / EXECUTOR_OUTPUT).is_file()
    # the summary quotes the user's dataset, program, folders and registry: each line escaped
    summary = [
        "",
        f"kubetrain run: {args.nodes} node(s) x {procs_per_node} process(es), "
        f"{training} on {args.dataset}",
        f"accuracy {accuracy:.3f} ({verdict}, threshold {args.threshold:g})",
        f"time     {elapsed:.1f}s",
        f"model    {storage.dereference(str(steps / 'collect-checkpoint' / 'model'))}",
        f"metrics  {publish_metrics(steps)}",
        f"report   {publish_report(str(steps / 'evaluate-model' / 'report'))}",
        *([f"events   {events} (tensorboard --logdir)"] if events is not None else []),
        f"promoted {step_parameters(steps, 'promote-model')['promoted_to']}"
        if promoted
        else "promoted no (see the promotion-gate step's log)",
    ]
    print("\n".join(terminal_text(line) for line in summary))
    return 0 if passed else 3


#: Where KFP's local runner keeps a step's outputs: <pipeline root>/<run>/<step>/ holds its
#: artifacts by output name and this file with its parameters (kfp 2.17
#: kfp/local/executor_input_utils.py construct_local_task_root, _EXECUTOR_OUTPUT_FILE).
EXECUTOR_OUTPUT = "executor_output.json"


def step_parameters(steps: Path, step: str) -> dict[str, Any]:
    """The output parameters step ``step`` of the run in ``steps`` returned."""
    return executor_output(steps, step)["parameterValues"]


def executor_output(steps: Path, step: str) -> dict[str, Any]:
    """What step ``step`` of the run in ``steps`` wrote as its outputs (KFP's executor output)."""
    return bounded_json.loads((steps / step / EXECUTOR_OUTPUT).read_text())


def how_to_see_more(run_folders: list[Path]) -> str:
    """The command that shows more of a failed run: the job's logs, in the folder the exit
    handler kept (``job_folder_kept``), else, without a job, the run again with every step's
    output."""
    kept = kept_job(run_folders)
    return f"kubetrain logs {kept[0]}" if kept else "kubetrain run --verbose (the same options)"


def kept_job(run_folders: list[Path]) -> tuple[str, Path] | None:
    """The failed run's job and its folder, if it launched one that is still there."""
    from kubetrain.backends.local.backend import LocalBackend

    for steps in run_folders:  # none when the run failed before its first step
        if not (steps / "launch-trainjob" / EXECUTOR_OUTPUT).is_file():
            continue
        job = step_parameters(steps, "launch-trainjob")["job_name"]
        with contextlib.suppress(JobNotFound):
            return job, LocalBackend().existing_job_dir(job)
    return None


@contextlib.contextmanager
def job_folder_kept() -> Iterator[None]:
    """While the steps run, deleting the job keeps its folder (``KEEP_FILES_ENV``, which the
    steps inherit): a failed run's exit handler deletes the job, whose node logs the run then
    points to."""
    from kubetrain.backends.local.files import KEEP_FILES_ENV

    os.environ[KEEP_FILES_ENV] = "1"
    try:
        yield
    finally:
        os.environ.pop(KEEP_FILES_ENV, None)


def tensorboard_events(checkpoint_dir: str, run_folder: Path) -> Path | None:
    """Rank 0's TensorBoard event files (written beside its checkpoints when the tensorboard
    package is installed), moved into the run's folder, beside the steps' outputs: they outlive
    the job folder a successful run removes. None when there are none."""
    import shutil

    from kubetrain import storage
    from kubetrain.train.options import TENSORBOARD_FOLDER

    if not storage.is_local(checkpoint_dir):
        return None
    events = storage.local_path(checkpoint_dir) / TENSORBOARD_FOLDER
    if not events.is_dir():
        return None
    return Path(shutil.move(events, run_folder / TENSORBOARD_FOLDER))


def job_folder_outcome(job: str, keep: bool) -> str:
    """Remove the job folder (its checkpoints, node logs) of a run whose steps all succeeded,
    unless ``keep``: collect has published the model, which is what the later steps and the
    user read. Says what became of it."""
    from kubetrain.backends.local.backend import LocalBackend

    backend = LocalBackend()
    if keep:
        return f"kept the job's folder {backend.job_dir(job)}: `kubetrain delete {job}` removes it"
    backend.delete(job)
    return f"removed the job's folder {backend.job_dir(job)} (--keep-job keeps it)"


@contextlib.contextmanager
def run_resource_name_resolved() -> Iterator[set[str]]:
    """Make KFP's local runner substitute ``dsl.PIPELINE_JOB_RESOURCE_NAME_PLACEHOLDER``, which
    the pipeline names its job and folders by; yields the run names it substituted (one).

    The runner substitutes the display-name placeholder only (kfp 2.17
    kfp/local/placeholder_utils.py resolve_individual_placeholder) and fails on this one, which
    it parses as an input's. It gets the value the runner gives the display-name placeholder,
    ``<pipeline>-<timestamp>``: unique per run, as the run's Workflow name is on a cluster
    (kubeflow/pipelines 2.17.0 backend/src/v2/driver/resolve.go)."""
    from kfp import dsl
    from kfp.local import placeholder_utils

    resolve = placeholder_utils.resolve_individual_placeholder
    run_names: set[str] = set()

    def resolve_resource_name_too(element: str, **context: Any) -> Any:
        run_name = context["pipeline_resource_name"]
        run_names.add(run_name)
        return resolve(
            element.replace(dsl.PIPELINE_JOB_RESOURCE_NAME_PLACEHOLDER, run_name), **context
        )

    placeholder_utils.resolve_individual_placeholder = resolve_resource_name_too
    try:
        yield run_names
    finally:
        placeholder_utils.resolve_individual_placeholder = resolve


@contextlib.contextmanager
def interpreter_put_in_kfp_s_own_command() -> Iterator[None]:
    """Make KFP's local runner put this interpreter's path for ``python3`` in the step's own
    command only (its ``sh -ec`` launcher), not in the arguments after ``--executor_input``:
    their JSON holds the pipeline's parameter values, and a user's program given as
    ``/venv/bin/python3 -c ...`` (any value holding ``python3``) reached the launch step as
    ``/venv/bin//venv/bin/python3``.

    The runner replaces the text ``python3`` in every part of the command but the component's
    code (kfp 2.17 kfp/local/subprocess_task_handler.py replace_python_executable, ~line 139,
    called from SubprocessTaskHandler.run); the parts are the component's command, then its
    args, which start with ``--executor_input`` (kfp/local/task_dispatcher.py ~line 160:
    ``list(container.command) + list(container.args)``)."""
    from kfp.local import subprocess_task_handler

    replace = subprocess_task_handler.replace_python_executable

    def replace_in_command_only(full_command: list[str], new_executable: str) -> list[str]:
        end = (
            full_command.index("--executor_input")
            if "--executor_input" in full_command
            else len(full_command)
        )
        return [*replace(full_command[:end], new_executable), *full_command[end:]]

    subprocess_task_handler.replace_python_executable = replace_in_command_only
    try:
        yield
    finally:
        subprocess_task_handler.replace_python_executable = replace


#: Marks every process a `kubetrain run` starts (its steps, their training job), which inherit
#: it, so an interrupted run can stop all of them and nothing else.
RUN_ID_ENV = "KUBETRAIN_RUN_ID"
#: How long an interrupted run's processes get to end on SIGTERM before SIGKILL.
STOP_GRACE_SECONDS = 5.0


@contextlib.contextmanager
def stopped_whole_on_interrupt(pipeline_root: Path) -> Iterator[None]:
    """Ctrl-C (SIGINT) or SIGTERM stops the whole run: the running step and the training job
    it launched (its supervisor, nodes and workers, in sessions of their own that no terminal
    signal reaches), then one line says so and the run exits 128+N.

    SIGTERM is turned into the KeyboardInterrupt SIGINT raises: on exactly that exception the
    `with subprocess.Popen` KFP's local runner uses returns without waiting for the step."""
    from kubetrain.backends.cancel import CANCEL_SIGNALS
    from kubetrain.backends.local.processes import stop_marked_processes

    run_id = uuid.uuid4().hex
    os.environ[RUN_ID_ENV] = run_id
    received: list[int] = []

    def interrupt(signum: int, _frame: Any) -> None:
        for sig in previous:  # a second Ctrl-C must not cut the clean-up short
            signal.signal(sig, signal.SIG_IGN)
        received.append(signum)
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in CANCEL_SIGNALS}
    try:
        yield
    except KeyboardInterrupt:
        signum = received[0] if received else signal.SIGINT
        stopped = stop_marked_processes(RUN_ID_ENV, run_id, STOP_GRACE_SECONDS)
        raise KubetrainError(
            f"stopped by {signal.Signals(signum).name}: stopped the running step and its "
            f"training job ({len(stopped)} process(es)); what the steps wrote stays in "
            f"{pipeline_root}",
            exit_code=128 + signum,
        ) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        os.environ.pop(RUN_ID_ENV, None)


def publish_metrics(steps: Path) -> Path:
    """The evaluate step's KFP Metrics as ``metrics.json`` in the run's folder: the local
    runner keeps a Metrics artifact's figures only as metadata in the step's executor output,
    and writes no file at the artifact's path."""
    from kubetrain.storage import atomic  # the storage package: not for --help

    metrics = executor_output(steps, "evaluate-model")["artifacts"]["metrics"]
    target = steps / "metrics.json"
    atomic.write_json(target, metrics["artifacts"][0]["metadata"])
    return target


def publish_report(artifact_path: str) -> Path:
    """The evaluate step's HTML report as ``report.html`` in the run's folder: KFP's local
    runner names the artifact file after the output, without an extension browsers need."""
    from kubetrain.storage import atomic  # the storage package: not for --help

    source = Path(artifact_path)
    target = source.parent.parent / "report.html"
    atomic.write_bytes(target, source.read_bytes())
    return target
