"""The collect tests write a checkpoint and collect it at once: a short grace keeps each from
waiting the default two seconds for files to hold still (the tests of the rule set their own)."""

from __future__ import annotations

import pytest

from kubetrain.storage import settled


@pytest.fixture(autouse=True)
def short_settling_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(settled, "GRACE_SECONDS", 0.3)
