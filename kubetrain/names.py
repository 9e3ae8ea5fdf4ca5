"""Job names derived deterministically from a pipeline run, so a retried step finds its job."""

from __future__ import annotations

import hashlib
import re
import secrets

# The Trainer's pods are named "<job>-node-<i>-<j>-<suffix>"; leave room for that in 63.
MAX_DERIVED_LENGTH = 47


def derive_job_name(run: str, step: str = "train") -> str:
    """RFC 1035 name from a run name and step: readable prefix plus a hash of both."""
    digest = hashlib.sha256(f"{run}\0{step}".encode()).hexdigest()[:8]
    slug = re.sub(r"[^a-z0-9]+", "-", f"{run}-{step}".lower()).strip("-")
    if not slug or not slug[0].isalpha():
        slug = f"kt-{slug}".rstrip("-")
    slug = slug[: MAX_DERIVED_LENGTH - len(digest) - 1].rstrip("-")
    return f"{slug}-{digest}"


def random_job_name(prefix: str = "kubetrain") -> str:
    return f"{prefix}-{secrets.token_hex(4)}"


def label_value(text: str) -> str:
    """``text`` made into a valid Kubernetes label value (≤ 63 chars, alphanumeric ends)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", text)[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", cleaned)
