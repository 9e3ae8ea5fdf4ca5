"""What every checkpoint reader offers (one module per writer, listed in
:data:`kubetrain.artifacts.checkpoint_formats.READERS`), as TorchX keeps one scheduler per
file behind ``schedulers/api.py``."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from kubetrain.artifacts.checkpoint_formats.writer import Entry
from kubetrain.errors import InvalidInput


@dataclass(frozen=True)
class Candidate:
    """A checkpoint a script wrote: ``relative`` is its file (a ``.pt``/``.safetensors`` file,
    an HF index, a DCP ``.metadata``) relative to the checkpoint folder; ``files`` every file
    it consists of (checked for settling); ``numbers`` the numbers in its name and
    ``family`` its name with them blanked (``model_epoch_#.pt``)."""

    relative: str
    format: str
    files: tuple[str, ...]
    mtime_ns: int
    numbers: tuple[int, ...] = ()
    family: str = ""


@dataclass
class ModelSource:
    """A checkpoint's model, ready to be written: its tensors by source name, their bytes in
    any order asked for, the ``epoch``/``step`` it records, and how it was found."""

    format: str
    entries: dict[str, Entry]
    chunks: Callable[[list[str]], Iterator[Any]]
    numbers: dict[str, int] = field(default_factory=dict)
    #: The node of the checkpoint the model is under (``app.model``); "" the top.
    state_key: str = ""
    #: The writer wraps the model in a module of its own whose attribute prefixes every name.
    owner_prefix: bool = False


class Reader(Protocol):
    """One writer's format."""

    #: The card's ``source_format`` values this reader produces and reads.
    FORMATS: tuple[str, ...]

    def recognise_folder(self, root: Path, folder: str, names: list[str]) -> list[Candidate]:
        """The checkpoints a folder is as a whole (DCP, an HF index); none: []."""
        ...

    def recognise_file(self, root: Path, relative: str) -> Candidate | None:
        """The checkpoint a single file is, or None."""
        ...

    def files(self, root: Path, candidate: Candidate) -> list[str]:
        """Every file the checkpoint is read from (relative to ``root``), listed files held to
        the rule before any is opened."""
        ...

    def read(self, root: Path, candidate: Candidate, state_key: str) -> ModelSource:
        """The model in ``candidate`` (the state dict ``state_key`` names, if given)."""
        ...


#: Files saved beside a model that are not one (Hugging Face's Trainer, common scripts).
AUXILIARY = re.compile(
    r"(optimizer|optim|scheduler|lr_scheduler|rng_state|training_args|scaler|trainer_state)"
    r"([-_.\d].*)?",
    re.IGNORECASE,
)
_NUMBER = re.compile(r"\d+")
#: One shard of a Hugging Face sharded checkpoint (``model-00001-of-00003.safetensors``,
#: ``pytorch_model-00002-of-00002.bin``): never a model by itself, only with its index.
HF_SHARD = re.compile(
    r"(?P<stem>.+)-(?P<part>\d{5,})-of-(?P<total>\d{5,})(?P<suffix>\.safetensors|\.bin)"
)


def is_auxiliary(name: str) -> bool:
    return AUXILIARY.fullmatch(name.split(".")[0]) is not None


def index_of_shard(name: str) -> str | None:
    """The index an HF shard's save writes after it (``model.safetensors.index.json``), or
    None when ``name`` is no shard."""
    shard = HF_SHARD.fullmatch(name)
    return f"{shard['stem']}{shard['suffix']}.index.json" if shard else None


def make_candidate(
    root: Path, relative: str, fmt: str, files: Iterable[str], named: str
) -> Candidate:
    """A candidate whose numbers and family come from ``named`` (its file, or its folder)."""
    files = tuple(files)
    numbers = tuple(int(n) for n in _NUMBER.findall(named))
    mtime = max((_mtime_ns(root / name) for name in files), default=0)
    return Candidate(relative, fmt, files, mtime, numbers, _NUMBER.sub("#", named))


def _mtime_ns(path: Path) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 0


def no_state_key(state_key: str, what: str) -> None:
    """A format that holds one flat set of tensors has nothing for ``--state-key`` to name."""
    if state_key:
        raise InvalidInput(
            "state_key",
            f"{what} is one flat set of tensors, with no state dict to choose",
            "drop --state-key",
        )


class SingleFile:
    """A format held in one file, told by its name's ending: the base of such readers."""

    FORMATS: tuple[str, ...]
    #: Name endings of its files.
    SUFFIXES: tuple[str, ...]

    def recognise_folder(self, root: Path, folder: str, names: list[str]) -> list[Candidate]:
        return []

    def recognise_file(self, root: Path, relative: str) -> Candidate | None:
        name = relative.rsplit("/", 1)[-1]
        if not name.endswith(self.SUFFIXES) or is_auxiliary(name) or index_of_shard(name):
            return None
        return make_candidate(root, relative, self.FORMATS[0], [relative], relative)

    def files(self, root: Path, candidate: Candidate) -> list[str]:
        return [candidate.relative]
