"""`kubetrain doctor`: check a cluster is ready for the steps."""

from __future__ import annotations

import argparse

from kubetrain.jobspec import DEFAULT_RUNTIME


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="check the cluster: API, Kubeflow Trainer (or Training Operator, or KubeRay), "
        "runtime, RBAC",
        description=(
            "Check that the cluster in $KUBECONFIG (or the pod's) is ready for the steps: the API "
            "answers, the Kubeflow Trainer CRDs are installed (and which TrainJob form they take) "
            "and the runtime exists (with --backend pytorchjob: the Training Operator's "
            "PyTorchJob CRD, its release and image; with --backend rayjob: KubeRay's RayJob "
            "CRD and its operator's image), and RBAC grants every verb the steps use, "
            "to you "
            "(SelfSubjectAccessReview) or to --service-account (SubjectAccessReview). Prints "
            "what is missing and how to fix it; exits 1 if anything is."
        ),
    )
    parser.add_argument(
        "--namespace",
        default="",
        help="namespace the steps will use; default the one they would use: this pod's, else "
        "the kubeconfig context's, else default",
    )
    parser.add_argument(
        "--service-account",
        default="",
        metavar="NAME",
        help=(
            "check the rights of this ServiceAccount of --namespace (the account the steps run "
            "as: kubetrain, or KFP's pipeline-runner / default-editor) with SubjectAccessReviews, "
            "instead of your own; needs the right to create them (a cluster admin has it)"
        ),
    )
    parser.add_argument(
        "--backend",
        default="trainer",
        choices=("trainer", "pytorchjob", "rayjob", "job"),
        help="the backend the steps will use: trainer (default: checks Kubeflow Trainer and "
        "the runtime), pytorchjob (checks Kubeflow Training Operator v1), rayjob (checks "
        "KubeRay's RayJob CRD, ray.io/v1) or job (none of them)",
    )
    parser.add_argument(
        "--runtime", default=DEFAULT_RUNTIME, help="runtime the TrainJobs will refer to"
    )
    parser.add_argument(
        "--runtime-kind",
        default="ClusterTrainingRuntime",
        help="ClusterTrainingRuntime (default) or TrainingRuntime",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from kubetrain.backends.kubernetes.client import load_api_client, resolve_namespace
    from kubetrain.backends.kubernetes.doctor import Check, diagnose

    def report(check: Check) -> None:
        mark = "ok  " if check.ok else "FAIL"
        print(f"{mark} {check.name:8} {check.detail}")
        if check.fix and not check.ok:
            print(f"     {'':8} fix: {check.fix}")

    from kubetrain import rules

    namespace = resolve_namespace(args.namespace)  # as launch and wait resolve it
    rules.namespace(namespace, "--namespace", "give the namespace the steps run in")
    if args.service_account:
        rules.dns1123_subdomain(
            args.service_account,
            "--service-account",
            "give a ServiceAccount's name, e.g. kubetrain",
        )
    ready = diagnose(
        load_api_client(),
        namespace,
        args.runtime,
        args.runtime_kind,
        report,
        service_account=args.service_account or None,
        backend=args.backend,
    )
    print("ready" if ready else "not ready: fix the FAIL lines above")
    return 0 if ready else 1
