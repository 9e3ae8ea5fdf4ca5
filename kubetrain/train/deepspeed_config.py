"""A user's DeepSpeed config (``--deepspeed-config``): read, checked and filled with our options.

Torch-free: the launch step checks a config with it before a job exists, and the trainer before
any process group starts; DeepSpeed itself is imported only to let it read the config, where it
is installed (:func:`check_with_deepspeed`). The value is a path to a JSON file or the JSON text
itself (what reaches a node as an argument: :func:`config_for_nodes`). The user's settings win;
ours fill only what the config leaves out (:func:`fill_config`).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import re
import sys
from collections.abc import Mapping
from typing import Any

from kubetrain import bounded_json, storage
from kubetrain.errors import InvalidInput
from kubetrain.rules import ZERO_STAGES, shown

#: A DeepSpeed config is a few hundred bytes; a megabyte is no config.
MAX_CONFIG_BYTES = 1024 * 1024
#: The batch settings, as DeepSpeed names them (docs: deepspeed.ai/docs/config-json/#batch-size).
TRAIN_BATCH = "train_batch_size"
MICRO_BATCH = "train_micro_batch_size_per_gpu"
ACCUMULATION = "gradient_accumulation_steps"
_BATCH_KEYS = (TRAIN_BATCH, MICRO_BATCH, ACCUMULATION)
#: How much of DeepSpeed's own message an error line quotes.
SAID_MAX = 240
_CONFIG_FIX = "give a JSON object (a file, or its text), as DeepSpeed's config-json describes"


def is_inline(value: str) -> bool:
    """JSON text rather than a path: a config's text starts with ``{`` (an array's with ``[``,
    taken as JSON to be refused as no object rather than as a file name)."""
    return value.lstrip()[:1] in ("{", "[")


def load_config(value: str, field: str) -> dict[str, Any]:
    """The config ``value`` holds (a local file's path, or inline JSON text), checked by
    :func:`check_config`; one line naming ``field`` when it cannot be read or is no config."""
    if is_inline(value):
        text, where = value, "its JSON text"
    else:
        text, where = _read_file(value, field), value
    try:
        config = bounded_json.loads(text, max_bytes=MAX_CONFIG_BYTES)
    except json.JSONDecodeError as exc:
        raise InvalidInput(field, f"{where} is not JSON ({exc.msg})", _CONFIG_FIX) from None
    return check_config(config, field)


def _read_file(path: str, field: str) -> str:
    if not storage.is_local(path):
        raise InvalidInput(
            field, f"{shown(path)} is not a local file", "give a JSON file here, or its text"
        )
    local = storage.local_path(path, field)
    if not local.is_file():
        problem = "is a folder" if local.is_dir() else "does not exist"
        raise InvalidInput(field, f"{local} {problem}", "give a DeepSpeed JSON config file")
    try:
        with open(local, "rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise InvalidInput(field, f"cannot read {local} ({exc.strerror})", _CONFIG_FIX) from None
    if len(data) > MAX_CONFIG_BYTES:
        raise InvalidInput(field, f"{local} is over {MAX_CONFIG_BYTES} bytes", _CONFIG_FIX)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput(field, f"{local} is not UTF-8 text", _CONFIG_FIX) from None


def _whole(config: Mapping[str, Any], key: str, field: str, within: str = "") -> int | None:
    value = config.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidInput(
            field, f"{within}{key} is {shown(value)}, not a whole number from 1", _CONFIG_FIX
        )
    return value


def check_config(config: Any, field: str) -> dict[str, Any]:
    """``config`` when it is an object whose batch settings are whole numbers and whose ZeRO
    stage, if it sets one, is one we train with (1, 2 or 3)."""
    if not isinstance(config, dict):
        raise InvalidInput(field, f"is a JSON {type(config).__name__}, not an object", _CONFIG_FIX)
    for key in (TRAIN_BATCH, MICRO_BATCH, ACCUMULATION):
        _whole(config, key, field)
    zero = config.get("zero_optimization")
    if zero is not None and not isinstance(zero, dict):
        raise InvalidInput(field, "zero_optimization is not an object", _CONFIG_FIX)
    stage = (zero or {}).get("stage")
    if stage is not None and (isinstance(stage, bool) or stage not in ZERO_STAGES):
        raise InvalidInput(
            field,
            f"zero_optimization.stage is {shown(stage)}",
            "use stage 1, 2 or 3 (or leave it out and pass --zero-stage)",
        )
    return config


def batch_settings(
    config: Mapping[str, Any],
    *,
    batch_size: int,
    grad_accum_steps: int,
    world_size: int,
    field: str,
) -> tuple[int, int, int]:
    """(micro batch, accumulation steps, train batch) for ``world_size`` processes: the config's,
    the one it leaves out derived from the two it gives as DeepSpeed derives it
    (deepspeed v0.19.8 runtime/config.py ``_set_batch_related_parameters``), else ours (our
    ``batch_size`` and ``grad_accum_steps`` before DeepSpeed's own defaults). Refused in one line
    when ``train_batch_size`` is not micro x accumulation x world size (DeepSpeed's
    ``_batch_assertion``, which it would raise only after the process group started)."""
    train = _whole(config, TRAIN_BATCH, field)
    micro = _whole(config, MICRO_BATCH, field)
    accumulation = _whole(config, ACCUMULATION, field)
    if train is None:
        micro, accumulation = micro or batch_size, accumulation or grad_accum_steps
        return micro, accumulation, micro * accumulation * world_size
    if micro is None:
        accumulation = accumulation or grad_accum_steps
        if train % (accumulation * world_size):
            raise InvalidInput(
                field,
                f"{TRAIN_BATCH} {train} is not a multiple of {ACCUMULATION} {accumulation} x "
                f"world size {world_size}, so no micro batch per process makes it",
                f"set {TRAIN_BATCH} to a multiple of {accumulation * world_size}, or set "
                f"{MICRO_BATCH} instead",
            )
        micro = max(train // (accumulation * world_size), 1)
    elif accumulation is None:
        accumulation = max(train // (micro * world_size), 1)
    if train != micro * accumulation * world_size:
        raise InvalidInput(
            field,
            f"{TRAIN_BATCH} {train} is not {MICRO_BATCH} {micro} x {ACCUMULATION} "
            f"{accumulation} x world size {world_size} (= {micro * accumulation * world_size})",
            f"set {TRAIN_BATCH} to {micro * accumulation * world_size}, or leave it out",
        )
    return micro, accumulation, train


def fill_config(
    config: Mapping[str, Any],
    *,
    batch_size: int,
    grad_accum_steps: int,
    world_size: int,
    optimizer: str,
    lr: float,
    clip_grad_norm: float,
    zero_stage: int,
    field: str,
) -> dict[str, Any]:
    """A copy of ``config`` with what it leaves out taken from our options: the batch settings
    (:func:`batch_settings`), the ZeRO stage, gradient clipping and the optimizer. Our AdamW is
    ``torch_adam`` (torch's own AdamW: DeepSpeed's FusedAdam or CPU Adam op would have to be
    compiled on the node, deepspeed v0.19.8 runtime/engine.py ``get_optimizer_configuration``),
    and so is a config's Adam/AdamW that does not say."""
    filled = copy.deepcopy(dict(config))
    micro, accumulation, train = batch_settings(
        config,
        batch_size=batch_size,
        grad_accum_steps=grad_accum_steps,
        world_size=world_size,
        field=field,
    )
    filled.update({MICRO_BATCH: micro, ACCUMULATION: accumulation, TRAIN_BATCH: train})
    filled.setdefault("gradient_clipping", clip_grad_norm)
    zero = filled.setdefault("zero_optimization", {})
    zero.setdefault("stage", zero_stage)
    if "optimizer" not in filled:
        if optimizer == "sgd":
            filled["optimizer"] = {"type": "SGD", "params": {"lr": lr, "momentum": 0.9}}
        else:
            filled["optimizer"] = {"type": "AdamW", "params": {"lr": lr}}
    chosen = filled["optimizer"]
    if isinstance(chosen, dict) and str(chosen.get("type", "")).lower() in ("adam", "adamw"):
        params = chosen.setdefault("params", {})
        if isinstance(params, dict):
            params.setdefault("torch_adam", True)
    return filled


def check_with_deepspeed(config: Mapping[str, Any], field: str) -> None:
    """DeepSpeed's own reading of the config, where DeepSpeed is installed (a launch step of
    the light install leaves it to the trainer): its ``DeepSpeedConfig`` checks every section
    (an unknown key, a wrong type), which it would otherwise do only inside
    ``deepspeed.initialize``, after the process group and the checkpoint folder. The batch
    settings are checked for the job's world size by :func:`batch_settings`; here they are
    one process's. What DeepSpeed prints meanwhile (its accelerator warning on first import)
    is no part of the one line a refusal is, nor of launch's stdout (the job's name)."""
    printed = io.StringIO()
    single = {key: value for key, value in config.items() if key not in _BATCH_KEYS}
    try:
        with contextlib.redirect_stdout(printed):
            from deepspeed.runtime.config import DeepSpeedConfig

            DeepSpeedConfig({**single, MICRO_BATCH: 1, ACCUMULATION: 1})
    except ImportError:
        return
    except Exception as exc:  # pydantic's ValidationError, DeepSpeed's asserts and ValueErrors
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        said = ": ".join(line for line in lines if not line.startswith("For further"))
        said = re.sub(r"\s*\[type=[^\]]*\]", "", said)[:SAID_MAX] or type(exc).__name__
        raise InvalidInput(
            field,
            f"DeepSpeed refuses it ({said})",
            "fix the setting it names, as DeepSpeed's config-json describes",
        ) from None
    finally:
        _restore_deepspeed_logging(printed)


def _restore_deepspeed_logging(printed: io.StringIO) -> None:
    """DeepSpeed's logger keeps the stdout of its first import as its stream (deepspeed
    v0.19.8 utils/logging.py ``create_logger``): one made while ``printed`` stood in for stdout
    writes to the real stdout again (``StreamHandler.setStream``), for a trainer's later logs."""
    import logging

    for handler in logging.getLogger("DeepSpeed").handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream is printed:
            handler.setStream(sys.stdout)


def config_for_nodes(value: str, field: str) -> str:
    """The config as every backend's nodes get it, an argument: a local file's JSON text (the
    file is not in the nodes), or the JSON text given; refused here in one line when it is
    missing or no config, before anything starts."""
    if not value:
        return ""
    config = load_config(value, field)
    return json.dumps(config, separators=(",", ":"), sort_keys=True)


def world_size_from_env(environ: Mapping[str, str] | None = None) -> int:
    """The job's process count before any process group exists: torchrun's ``WORLD_SIZE``, or
    mpirun's ``OMPI_COMM_WORLD_SIZE``, else 1."""
    env = os.environ if environ is None else environ
    for name in ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"):
        value = env.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1
