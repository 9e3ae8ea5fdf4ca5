"""Dataset and checkpoint manifests: every unusable manifest is one clear IntegrityError."""

from __future__ import annotations

import pytest

from kubetrain import checkpoint_manifest, datasets
from kubetrain.errors import IntegrityError

READERS = [
    pytest.param(datasets.read_manifest, "dataset", id="dataset"),
    pytest.param(checkpoint_manifest.read_manifest, "checkpoint", id="checkpoint"),
]


@pytest.mark.parametrize(("read", "kind"), READERS)
@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "no manifest.json"),
        (b"{not json", "is not valid JSON"),
        (b"\xff\xfe\x00", "is unreadable"),
        (b"[1, 2]", "format 'list' is not"),
        (b'{"format": "someone.else/v9"}', "format 'someone.else/v9' is not"),
    ],
)
def test_unusable_manifest_is_one_integrity_error_naming_the_folder(
    tmp_path, read, kind, content, problem
):
    if content is not None:
        (tmp_path / "manifest.json").write_bytes(content)
    with pytest.raises(IntegrityError, match=problem) as caught:
        read(tmp_path)
    message = str(caught.value)
    assert message.startswith(f"{kind} {tmp_path}: ") and "\n" not in message
