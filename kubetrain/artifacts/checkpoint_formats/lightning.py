"""Lightning's ``.ckpt`` (``ModelCheckpoint``: ``lightning_logs/version_N/checkpoints/
epoch=E-step=S.ckpt``, ``last.ckpt``): a ``torch.save``d dict whose ``state_dict`` is the
LightningModule's, next to ``optimizer_states``, ``lr_schedulers``, ``loops``, ``callbacks``
and ``hyper_parameters`` (Lightning's ``trainer/connectors/checkpoint_connector.py``
``dump_checkpoint``). The module's own attribute (``self.model = Net()`` gives ``model.``)
is taken off every name unless a model factory's names say otherwise.

Loaded with ``weights_only=True``. Lightning 2.6 saves ``hyper_parameters`` as a plain dict,
but older releases (and ``hparams`` a script saves itself) pickle Lightning's ``AttributeDict``,
a dict subclass, which torch's allowlist reads as a plain ``dict`` by name (the
``(object, name)`` form of ``torch.serialization.safe_globals``): Lightning need not be
installed and none of its code runs."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kubetrain.artifacts.checkpoint_formats.api import Candidate, ModelSource, SingleFile
from kubetrain.artifacts.checkpoint_formats.torch_save import (
    numbers_beside,
    read_saved,
    tensors_source,
)
from kubetrain.artifacts.model_card import SOURCE_LIGHTNING
from kubetrain.errors import IntegrityError

#: The key Lightning's checkpoint records its version under (``pytorch_lightning`` too).
VERSION_KEY = "pytorch-lightning_version"
#: Lightning's classes a checkpoint pickles, read as the plain containers they subclass.
SAFE_GLOBALS = [
    (dict, f"{module}.AttributeDict")
    for module in (
        "lightning.fabric.utilities.data",
        "lightning.pytorch.utilities.parsing",
        "pytorch_lightning.utilities.parsing",
        "lightning_fabric.utilities.data",
    )
]


def _check(saved: Any, what: str) -> None:
    if not isinstance(saved, Mapping) or VERSION_KEY not in saved:
        raise IntegrityError(
            f"{what} is not a Lightning checkpoint (no {VERSION_KEY!r}); save it with "
            "Lightning's Trainer, or as a .pt file with torch.save"
        )


class Lightning(SingleFile):
    FORMATS = (SOURCE_LIGHTNING,)
    SUFFIXES = (".ckpt",)

    def read(self, root: Path, candidate: Candidate, state_key: str) -> ModelSource:
        saved, choice, state = read_saved(root, candidate, state_key, SAFE_GLOBALS, _check)
        return tensors_source(
            SOURCE_LIGHTNING,
            state,
            numbers=numbers_beside(saved),
            state_key=choice.state_key,
            owner_prefix=choice.state_key == "state_dict",
        )
