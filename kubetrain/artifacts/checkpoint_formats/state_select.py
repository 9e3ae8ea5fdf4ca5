"""Which part of a checkpoint is the model: one rule for every format that saves nested
state (a ``torch.save``d dict, a Lightning ``.ckpt``, a DCP checkpoint's planner keys).

A checkpoint is seen as leaves at key paths (``("app", "model", "fc.weight")``), each a
tensor or not. A *state dict* is a node with tensor leaves and no sub-dict other than
training state. Training state — optimizers (a key such as ``optim``/``optimizer_states``,
or a dict of ``state`` + ``param_groups``), schedulers, scalers — is never the model.

The model is, in this order: the node ``--state-key`` names (``app.model``; never training
state); the top itself when it is a state dict and nothing else is named as a model; the one
state dict under a model key (:func:`is_model_key`). Several such, or only state dicts under
other keys, is ambiguous and refused, listing what was found: collect never guesses.

Inside a state dict, the first part of the names is a submodule (a LightningModule's
``self.model`` and ``self.ema_model`` give ``model.*`` and ``ema_model.*``): two submodules
named as models are two models, refused unless ``--state-key state_dict.model`` names one,
which is published without its prefix. A state dict of optimizer moments only
(``state.0.exp_avg``...) is training state, whatever key holds it.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubetrain.artifacts.manifest import shown
from kubetrain.errors import IntegrityError, InvalidInput

#: Keys real scripts keep a model's state dict under (compared lower-cased): PyTorch's
#: tutorials (``model_state_dict``, ``MODEL_STATE``), Lightning (``state_dict``), timm and
#: friends (``model``, ``module``, ``net``, ``network``) and EMA copies.
MODEL_KEYS = (
    "model_state_dict", "state_dict", "model", "model_state", "module", "net", "network",
    "ema", "model_ema", "ema_state_dict", "ema_model", "state_dict_ema",
)  # fmt: skip
#: A key holding one of these words (split at ``_``/``-``) names a model too (timm's
#: ``state_dict_ema``, ``teacher_model``).
_MODEL_WORDS = {"model", "ema", "net", "network"}
#: Submodules that are whole models of their own beside another (distillation): with a second
#: model-named one, a state dict holding them holds several models.
_OTHER_MODELS = {"teacher", "student", "generator", "discriminator"}
#: The last part of the names of a torch optimizer's per-parameter state.
OPTIMIZER_MOMENTS = {
    "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "step", "square_avg",
    "acc_delta", "sum", "exp_inf", "mu", "eta", "ax", "prev", "step_size",
}  # fmt: skip
#: Keys of training state, never of the model (compared lower-cased).
TRAINING_STATE_KEYS = (
    "optimizer", "optimizers", "optimizer_state_dict", "optimizer_states", "optim",
    "optim_state_dict", "optim_state", "opt", "opt_state", "lr_scheduler", "lr_schedulers",
    "scheduler", "schedulers", "scheduler_state_dict", "scaler", "grad_scaler",
)  # fmt: skip
#: A torch optimizer's ``state_dict()`` holds exactly these two.
_OPTIMIZER_SHAPE = {"state", "param_groups"}
STATE_KEY_OPTION = "--state-key"
SAVE_STATE_DICT = "save the model's state_dict() (a dict of tensors)"
#: How many paths a refusal lists.
_LISTED = 6


@dataclass(frozen=True)
class Leaf:
    """One saved value: where it is, and whether it is a tensor (else its type's name)."""

    path: tuple[Hashable, ...]
    tensor: bool
    kind: str = "Tensor"


@dataclass(frozen=True)
class Choice:
    """The model found: the node it is under (``()`` the top), its leaves' names (keys of that
    node) mapped to their full paths, and the node written as ``--state-key`` writes it."""

    node: tuple[Hashable, ...]
    names: dict[str, tuple[Hashable, ...]]

    @property
    def state_key(self) -> str:
        return dotted(self.node)


def is_model_key(key: Hashable) -> bool:
    """Whether a key names a model (:data:`MODEL_KEYS`, or a key of :data:`_MODEL_WORDS`)."""
    text = str(key).lower()
    return text in MODEL_KEYS or bool(_MODEL_WORDS & set(re.split(r"[_\-]", text)))


def dotted(path: Iterable[Hashable]) -> str:
    return ".".join(str(part) for part in path)


def leaves_of(saved: Mapping[Any, Any], is_tensor: Any) -> list[Leaf]:
    """The leaves of a loaded nested mapping (lists and other values are leaves)."""
    found: list[Leaf] = []

    def walk(node: Mapping[Any, Any], path: tuple[Hashable, ...]) -> None:
        for key, value in node.items():
            if isinstance(value, Mapping) and value:
                walk(value, (*path, key))
            else:
                found.append(Leaf((*path, key), is_tensor(value), type(value).__name__))

    walk(saved, ())
    return found


def _training_state(path: tuple[Hashable, ...], children: set[Hashable]) -> bool:
    named = bool(path) and str(path[-1]).lower() in TRAINING_STATE_KEYS
    return named or _OPTIMIZER_SHAPE <= {str(child) for child in children}


def choose_state(leaves: list[Leaf], state_key: str, what: str) -> Choice:
    """The model among ``leaves`` by the module's rule, or one line saying why none is."""
    children: dict[tuple[Hashable, ...], set[Hashable]] = defaultdict(set)
    for leaf in leaves:
        for depth in range(len(leaf.path)):
            children[leaf.path[:depth]].add(leaf.path[depth])
    nodes = set(children)
    training = {node for node in nodes if _training_state(node, children[node])}

    def under_training(node: tuple[Hashable, ...]) -> bool:
        return any(node[:depth] in training for depth in range(len(node) + 1))

    tensor_parents = {leaf.path[:-1] for leaf in leaves if leaf.tensor}
    state_dicts = sorted(
        (
            node
            for node in tensor_parents
            if not under_training(node)
            and all(
                (*node, child) not in nodes or (*node, child) in training
                for child in children[node]
            )
        ),
        key=dotted,
    )
    if state_key:
        return _named(leaves, state_key, state_dicts, nodes, under_training, what)
    modelled = [node for node in state_dicts if node and is_model_key(node[-1])]
    chosen = modelled + ([()] if () in state_dicts else [])
    if len(chosen) == 1:
        return _choice(leaves, chosen[0], what)
    found = _found(state_dicts)
    if len(chosen) > 1:
        raise IntegrityError(
            f"{what} holds several state dicts that may be the model ({found}); name the model's "
            f"with {STATE_KEY_OPTION}"
        )
    if state_dicts:
        raise IntegrityError(
            f"{what} holds tensors under {found} but no state dict under a model key "
            f"({', '.join(MODEL_KEYS[:3])}...); name the model's with {STATE_KEY_OPTION}, or "
            "save it under model_state_dict"
        )
    if any(leaf.tensor for leaf in leaves):
        optimizer = _found(sorted(training, key=dotted))
        raise IntegrityError(
            f"{what} holds only training state ({optimizer}), no model; {SAVE_STATE_DICT} too"
        )
    if not leaves:
        raise IntegrityError(f"{what} holds an empty state dict; {SAVE_STATE_DICT}")
    raise IntegrityError(f"{what} holds no tensors; {SAVE_STATE_DICT}")


def _found(paths: list[tuple[Hashable, ...]]) -> str:
    shown_paths = [shown(dotted(path)) if path else "the top level" for path in paths[:_LISTED]]
    more = f" and {len(paths) - _LISTED} more" if len(paths) > _LISTED else ""
    return ", ".join(shown_paths) + more


def _named(
    leaves: list[Leaf],
    state_key: str,
    state_dicts: list[tuple[Hashable, ...]],
    nodes: set[tuple[Hashable, ...]],
    under_training: Any,
    what: str,
) -> Choice:
    named = [n for n in nodes if dotted(n) == state_key]
    inside = [
        (node, state_key[len(dotted(node)) + 1 :])
        for node in state_dicts
        if node and state_key.startswith(dotted(node) + ".")
    ]
    inside = [(node, sub) for node, sub in inside if sub in _submodules(leaves, node)]
    if len(named) + len(inside) > 1:
        raise InvalidInput(
            "state_key",
            f"{shown(state_key)} names {len(named) + len(inside)} places in {what} (keys with "
            "dots in them)",
            "save the model under a key without dots",
        )
    if inside:
        node, sub = inside[0]
        return _submodule(_choice(leaves, node, what, whole=True), sub)
    node = named[0] if named else None
    if node is not None and node and under_training(node):
        raise InvalidInput(
            "state_key",
            f"{shown(state_key)} in {what} is training state (an optimizer, scheduler or "
            "scaler), not the model",
            f"name the model's state dict; found {_found(state_dicts) or 'none'}",
        )
    if node not in state_dicts:
        raise InvalidInput(
            "state_key",
            f"{what} holds no state dict at {shown(state_key)}",
            f"name one of: {_found(state_dicts) or 'none found'}",
        )
    return _choice(leaves, node, what)


def _submodules(leaves: list[Leaf], node: tuple[Hashable, ...]) -> set[str]:
    """The first parts of the names of the state dict at ``node`` that have more after them."""
    return {
        str(leaf.path[-1]).split(".", 1)[0]
        for leaf in leaves
        if leaf.path[:-1] == node and "." in str(leaf.path[-1])
    }


def _submodule(choice: Choice, sub: str) -> Choice:
    """Only the names of submodule ``sub`` of ``choice``, without its prefix."""
    prefix = f"{sub}."
    names = {n.removeprefix(prefix): p for n, p in choice.names.items() if n.startswith(prefix)}
    return Choice((*choice.node, sub), names)


def _choice(
    leaves: list[Leaf], node: tuple[Hashable, ...], what: str, whole: bool = False
) -> Choice:
    """The state dict at ``node``: every value a tensor with a text name, else refused; one
    holding several models as submodules is refused unless ``whole`` (one is being named)."""
    where = f"{what}: {dotted(node)}" if node else what
    names: dict[str, tuple[Hashable, ...]] = {}
    for leaf in leaves:
        if leaf.path[:-1] != node:
            continue
        name = leaf.path[-1]
        if not isinstance(name, str) or not name:
            raise IntegrityError(
                f"{where}: state dict key {shown(name)} is not a tensor name; {SAVE_STATE_DICT}"
            )
        if not leaf.tensor:
            raise IntegrityError(
                f"{where}: state dict entry {shown(name)} is of type {leaf.kind}, not a tensor; "
                f"{SAVE_STATE_DICT}"
            )
        names[name] = leaf.path
    if names and all(name.rsplit(".", 1)[-1] in OPTIMIZER_MOMENTS for name in names):
        raise IntegrityError(
            f"{where} holds optimizer state ({', '.join(shown(n) for n in sorted(names)[:3])}"
            "...), no model; "
            f"{SAVE_STATE_DICT} too"
        )
    models = sorted(
        sub for sub in _submodules(leaves, node) if is_model_key(sub) or sub in _OTHER_MODELS
    )
    if len(models) > 1 and not whole:
        paths = [(*node, sub) for sub in models]
        raise IntegrityError(
            f"{where} holds several models ({_found(paths)}); name the model's with "
            f"{STATE_KEY_OPTION}"
        )
    return Choice(node, names)
