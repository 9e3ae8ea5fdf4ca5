"""The published names of a model's tensors: the names its wrappers added taken off, and,
where a model factory is known, the names it loads under checked before anything is written."""

from __future__ import annotations

from collections.abc import Mapping

from kubetrain.artifacts.manifest import shown
from kubetrain.errors import IntegrityError

#: Prefixes a wrapper puts on every name of ``model.state_dict()``: DistributedDataParallel's
#: ``module.`` and ``torch.compile``'s ``_orig_mod.``.
WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def _without_wrappers(names: list[str]) -> dict[str, str]:
    renamed = {name: name for name in names}
    stripped = True
    while stripped and renamed:
        stripped = False
        for prefix in WRAPPER_PREFIXES:
            if all(v.startswith(prefix) and len(v) > len(prefix) for v in renamed.values()):
                renamed = {k: v.removeprefix(prefix) for k, v in renamed.items()}
                stripped = True
    return renamed


def _without_owner(renamed: dict[str, str]) -> dict[str, str]:
    """A LightningModule's ``self.model = Net()`` puts ``model.`` on every name: the first
    part every name shares, taken off (none when the names differ there)."""
    firsts = {name.split(".", 1)[0] for name in renamed.values()}
    if len(firsts) != 1 or not all("." in name for name in renamed.values()):
        return renamed
    return {k: v.split(".", 1)[1] for k, v in renamed.items()}


def published_names(
    shapes: Mapping[str, tuple[int, ...]],
    owner_prefix: bool,
    expected: Mapping[str, tuple[int, ...]] | None,
    what: str,
    factory: str = "",
) -> dict[str, str]:
    """Source name → published name. ``owner_prefix``: the writer wraps the model in a module
    of its own (Lightning), whose attribute name is taken off too. With ``expected`` (the
    model factory's names and shapes) the naming that loads into it is taken, else refused in
    one line naming the first mismatch."""
    base = _without_wrappers(list(shapes))
    owned = _without_owner(base)
    variants = [owned, base] if owner_prefix else [base, owned]
    if expected is None:
        return variants[0]
    for variant in variants:
        if {variant[k]: tuple(shapes[k]) for k in shapes} == dict(expected):
            return variant
    return _mismatch(variants[0], shapes, expected, what, factory)


def _mismatch(
    renamed: dict[str, str],
    shapes: Mapping[str, tuple[int, ...]],
    expected: Mapping[str, tuple[int, ...]],
    what: str,
    factory: str,
) -> dict[str, str]:
    published = {renamed[k]: tuple(shapes[k]) for k in shapes}
    missing = sorted(set(expected) - set(published))
    extra = sorted(set(published) - set(expected))
    wrong = sorted(n for n in set(expected) & set(published) if expected[n] != published[n])
    if missing:
        problem = f"lacks {shown(missing[0])} ({len(missing)} of the model's tensors missing)"
    elif extra:
        problem = f"holds {shown(extra[0])}, which the model has not ({len(extra)} extra)"
    else:
        name = wrong[0]
        problem = (
            f"holds {shown(name)} of shape {list(published[name])}, the model's is "
            f"{list(expected[name])}"
        )
    raise IntegrityError(
        f"{what} does not load into model_factory {factory}: it {problem}; collect the "
        "checkpoint of this model (--checkpoint-file, --state-key) or name the factory that "
        "built it"
    )
