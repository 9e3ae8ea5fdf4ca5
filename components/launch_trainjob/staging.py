"""Copy a prepared dataset onto storage the training pods share (a mounted PVC).

On a cluster, a KFP artifact lives in the pipeline's object store, which the TrainJob's pods
cannot read; the launch step, which mounts the shared volume, copies the dataset there first.
The copy is published atomically and reused when an identical one is already there. Only the
manifest and the files it lists are copied, each held to the manifest rule first: whatever
else lies in the folder (a link to /dev/zero, a FIFO) is never opened.
"""

from __future__ import annotations

import shutil

from kubetrain import storage
from kubetrain.artifacts.datasets import read_manifest
from kubetrain.artifacts.manifest import MANIFEST
from kubetrain.artifacts.output_rule import DATASET, check_output
from kubetrain.artifacts.publish import publish_verified
from kubetrain.storage.verified_copy import copy_verified


def stage_dataset(source_dir: str, target_dir: str, field: str = "data_dir") -> str:
    """Publish a copy of ``source_dir`` at ``target_dir`` unless an identical one is there;
    ``target_dir`` (the option ``field``) must be one the output rule allows
    (:mod:`kubetrain.artifacts.output_rule`), never the source or a folder inside or around it.
    Each split file is copied verified against the sha256 the source's manifest records, and
    the copy is published by the one road
    (:func:`kubetrain.artifacts.publish.publish_verified`), which refuses it, nothing published,
    when the copied manifest records other digests than those the files were verified to."""
    output = check_output(target_dir, field, DATASET, {"data": source_dir})
    source_manifest = read_manifest(source_dir)
    target = storage.local_path(target_dir, field)  # a file:// URL names a local folder
    if (target / MANIFEST).is_file():
        if read_manifest(target) == source_manifest:
            return str(target)
    source = storage.local_path(storage.dereference(source_dir), "data")
    staged = storage.staging_dir(target)
    try:
        shutil.copyfile(source / MANIFEST, staged / MANIFEST)
        verified = {}
        for entry in source_manifest["splits"].values():
            name = entry["file"]
            (staged / name).parent.mkdir(parents=True, exist_ok=True)
            copied = copy_verified(
                str(source / name), str(staged / name), expected_sha256=entry["sha256"]
            )
            verified[name] = copied.sha256
        publish_verified(staged, output, verified)
    except BaseException:
        storage.discard_staging(staged)
        raise
    return str(target)
