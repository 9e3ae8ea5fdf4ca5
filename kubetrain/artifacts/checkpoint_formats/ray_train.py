"""Ray Train's own record of a run's checkpoints, so collect takes the one Ray says is the
run's newest from a Ray Train script's storage folder, and never a ``checkpoint_*`` folder Ray
did not record (a report that did not finish: its folder is written before the record).

Ray 2.60 (Train v2) keeps, beside the run's ``checkpoint_<time>/`` folders, the record
``checkpoint_manager_snapshot.json`` (``ray/train/v2/_internal/constants.py``
``CHECKPOINT_MANAGER_SNAPSHOT_FILENAME``), rewritten after each report by
``ray/train/v2/_internal/execution/checkpoint/checkpoint_manager.py``
``CheckpointManager._write_state_to_storage`` (``_save_state``): ``checkpoint_results`` in report
order, each with its ``checkpoint_dir_name``, and ``latest_checkpoint_result``, the checkpoint
``ray.train.get_checkpoint`` resumes from and ``Result.from_path(...).checkpoint`` returns
(``ray/train/v2/api/result.py`` ``Result._from_checkpoint_manager``). Folders evicted by
``CheckpointConfig(num_to_keep)`` leave the record with their deletion. No Ray is imported: the
record is JSON, read bounded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubetrain import bounded_json
from kubetrain.artifacts.checkpoint_formats.files import held_to_rule, join, read_record
from kubetrain.errors import IntegrityError

RAY_RECORD = "checkpoint_manager_snapshot.json"
#: The folders Ray Train reports checkpoints into (``checkpoint_<time>``; Train v1's
#: ``checkpoint_<index>``).
RAY_CHECKPOINT_PREFIX = "checkpoint_"


def recorded_checkpoints(root: Path, folder: str) -> list[str]:
    """The checkpoint folders Ray recorded in ``folder`` (relative to ``root``; a run's storage
    folder holding :data:`RAY_RECORD`), oldest first and the latest last. A record that is
    not Ray's is refused in one line: a guess could publish a checkpoint Ray never finished."""
    relative = join(folder, RAY_RECORD)
    path = held_to_rule(root, relative)
    try:
        record = bounded_json.loads(read_record(path))
        results = [_dir_name(result) for result in record["checkpoint_results"]]
        latest = record.get("latest_checkpoint_result")
        newest = _dir_name(latest) if latest is not None else None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise IntegrityError(
            f"{path} is not Ray Train's checkpoint record ({type(exc).__name__}: {exc}); "
            "point --checkpoint-dir at a Ray Train run's storage folder, or name the checkpoint "
            "file with --checkpoint-file"
        ) from None
    if newest is not None and newest in results:  # reported last, whatever the list's order
        results.remove(newest)
        results.append(newest)
    return results


def _dir_name(result: Any) -> str:
    """A recorded checkpoint's folder: one name, directly in the run's folder."""
    name = result["checkpoint_dir_name"]
    if not isinstance(name, str) or not name.startswith(RAY_CHECKPOINT_PREFIX) or "/" in name:
        raise ValueError(f"checkpoint_dir_name {name!r} is no checkpoint folder of the run")
    return name
