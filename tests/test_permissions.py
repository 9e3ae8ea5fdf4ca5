"""What `kubetrain doctor` checks is exactly what runtimes/rbac.yaml grants."""

from __future__ import annotations

from pathlib import Path

import yaml

from kubetrain.backends.kubernetes.permissions import REQUIRED

RBAC = Path(__file__).resolve().parents[1] / "runtimes" / "rbac.yaml"


def granted() -> set[tuple[str, str, str, bool, tuple[str, ...]]]:
    rules = set()
    for document in yaml.safe_load_all(RBAC.read_text()):
        if document["kind"] not in ("Role", "ClusterRole"):
            continue
        cluster = document["kind"] == "ClusterRole"
        for rule in document["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        names = tuple(rule.get("resourceNames", ()))
                        rules.add((group, resource, verb, cluster, names))
    return rules


def test_doctor_checks_exactly_what_rbac_grants():
    needed = {(p.group, p.resource, verb, p.cluster, p.names) for p in REQUIRED for verb in p.verbs}
    assert needed == granted()
