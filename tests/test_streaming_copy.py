"""copy_verified: bounded-memory, sha256-verified, resumable copies between fsspec locations."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubetrain.errors import IntegrityError, KubetrainError
from kubetrain.storage.verified_copy import copy_verified
from tests.support.peak_memory import run_measuring_peak_memory
from tests.support.s3_server import S3Server
from tests.support.tiny_filesystem import (
    run_python_on_tiny_filesystem,
    tiny_filesystem_available,
)

CHUNK = 64 * 1024
REPO = Path(__file__).resolve().parents[1]


def make_file(path: Path, size: int, seed: int = 0) -> str:
    """Write ``size`` pseudo-random bytes to ``path``; return their sha256."""
    data = hashlib.shake_256(f"seed-{seed}".encode()).digest(size)
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".part" in p.name)


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


# -- local to local ------------------------------------------------------------------------------


def test_local_round_trip_and_idempotent_retry(tmp_path: Path) -> None:
    src, dst = tmp_path / "src.bin", tmp_path / "out" / "model.safetensors"
    size = 10 * CHUNK + 123
    sha = make_file(src, size)

    result = copy_verified(
        str(src), str(dst), expected_sha256=sha, expected_size=size, chunk_size=CHUNK
    )

    assert (result.bytes_copied, result.resumed_from, result.sha256) == (size, 0, sha)
    assert result.seconds >= 0
    assert dst.read_bytes() == src.read_bytes()
    assert leftovers(dst.parent) == []

    again = copy_verified(f"file://{src}", f"file://{dst}", expected_sha256=sha.upper())
    assert (again.bytes_copied, again.resumed_from, again.sha256) == (0, 0, sha)

    src.unlink()  # cleaned up after the first success: a retried step still succeeds
    assert copy_verified(str(src), str(dst), expected_sha256=sha).bytes_copied == 0


def test_target_with_other_content_is_replaced_only_once_verified(tmp_path: Path) -> None:
    src, dst = tmp_path / "src.bin", tmp_path / "model.safetensors"
    sha = make_file(src, 3 * CHUNK)
    dst.write_bytes(b"an older checkpoint")

    bad = hashlib.sha256(b"something else").hexdigest()
    with pytest.raises(IntegrityError):
        copy_verified(str(src), str(dst), expected_sha256=bad, chunk_size=CHUNK)
    assert dst.read_bytes() == b"an older checkpoint"  # untouched by the failed copy

    result = copy_verified(str(src), str(dst), expected_sha256=sha, chunk_size=CHUNK)
    assert result.bytes_copied == 3 * CHUNK
    assert dst.read_bytes() == src.read_bytes()
    assert leftovers(tmp_path) == []


def test_corrupt_source_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    src, dst = tmp_path / "model-00001.safetensors", tmp_path / "out" / "model.safetensors"
    sha = make_file(src, 5 * CHUNK)
    data = bytearray(src.read_bytes())
    data[3 * CHUNK + 7] ^= 0x01  # one flipped bit
    src.write_bytes(bytes(data))
    actual = hashlib.sha256(data).hexdigest()

    with pytest.raises(IntegrityError) as caught:
        copy_verified(str(src), str(dst), expected_sha256=sha, chunk_size=CHUNK)

    message = str(caught.value)
    assert str(src) in message and sha in message and actual in message
    assert not dst.exists()
    assert leftovers(dst.parent) == []


def test_wrong_size_is_refused_before_copying(tmp_path: Path) -> None:
    src, dst = tmp_path / "src.bin", tmp_path / "dst.bin"
    sha = make_file(src, 1000)
    with pytest.raises(IntegrityError, match=r"1000 bytes, expected 999"):
        copy_verified(str(src), str(dst), expected_sha256=sha, expected_size=999)
    assert list(tmp_path.iterdir()) == [src]


def test_missing_source(tmp_path: Path) -> None:
    with pytest.raises(IntegrityError, match="does not exist"):
        copy_verified(str(tmp_path / "nope"), str(tmp_path / "dst"), expected_sha256="0" * 64)


@pytest.mark.parametrize("kernel", ["EXDEV", "ENOSYS", "stops early"])
def test_copy_without_the_kernel_copy_falls_back_to_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel: str
) -> None:
    """Where copy_file_range cannot copy (another filesystem, an old kernel) or reports the end
    too soon (filesystems that cannot tell), the rest is read and written through Python."""
    import errno

    src, dst = tmp_path / "src.bin", tmp_path / "out" / "model.safetensors"
    size = 5 * CHUNK + 9
    sha = make_file(src, size)
    real = os.copy_file_range
    calls = []

    def copy_file_range(*args: int) -> int:
        calls.append(args)
        if kernel == "stops early":
            return real(*args) if len(calls) == 1 else 0
        raise OSError(getattr(errno, kernel), kernel)

    monkeypatch.setattr(os, "copy_file_range", copy_file_range, raising=False)
    result = copy_verified(str(src), str(dst), expected_sha256=sha, chunk_size=CHUNK)

    assert calls and (result.bytes_copied, result.resumed_from) == (size, 0)
    assert dst.read_bytes() == src.read_bytes()
    assert leftovers(dst.parent) == []


def test_what_is_verified_is_the_written_file_not_the_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sha256 is of the part file read back, so a copy that went wrong on the way (here a
    kernel copy that damages one byte) is refused even though the source is intact."""
    src, dst = tmp_path / "src.bin", tmp_path / "model.safetensors"
    sha = make_file(src, 4 * CHUNK)
    real = os.copy_file_range

    def damaging_copy(src_fd: int, dst_fd: int, count: int, src_at: int, dst_at: int) -> int:
        copied = real(src_fd, dst_fd, count, src_at, dst_at)
        if src_at == 0:
            os.pwrite(dst_fd, b"\xff", 7)
        return copied

    monkeypatch.setattr(os, "copy_file_range", damaging_copy, raising=False)
    with pytest.raises(IntegrityError, match=sha):
        copy_verified(str(src), str(dst), expected_sha256=sha, chunk_size=CHUNK)
    assert not dst.exists()
    assert leftovers(tmp_path) == []


def test_disk_full_in_the_kernel_copy_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    src, dst = tmp_path / "src.bin", tmp_path / "model.safetensors"
    sha = make_file(src, 4 * CHUNK)
    real = os.copy_file_range

    def filling_copy(src_fd: int, dst_fd: int, count: int, src_at: int, dst_at: int) -> int:
        if src_at:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(src_fd, dst_fd, count, src_at, dst_at)

    monkeypatch.setattr(os, "copy_file_range", filling_copy, raising=False)
    with pytest.raises(KubetrainError, match="no space left") as caught:
        copy_verified(str(src), str(dst), expected_sha256=sha, chunk_size=CHUNK)
    assert not isinstance(caught.value, IntegrityError)
    assert f"after {CHUNK} bytes" in str(caught.value)
    assert not dst.exists()
    assert leftovers(tmp_path) == []


# -- interruption and resume ---------------------------------------------------------------------


def interrupted(src: Path, dst: Path, length: int, sidecar: dict[str, object]) -> None:
    """Leave what an interrupted copy leaves: the first ``length`` bytes and the sidecar."""
    Path(f"{dst}.part").write_bytes(src.read_bytes()[:length])
    Path(f"{dst}.part.json").write_text(json.dumps(sidecar))


def test_resume_appends_to_the_part_an_interrupted_copy_left(tmp_path: Path) -> None:
    src, dst = tmp_path / "src.bin", tmp_path / "model.safetensors"
    size = 8 * CHUNK + 5
    sha = make_file(src, size)
    interrupted(src, dst, 3 * CHUNK + 17, {"sha256": sha, "size": size, "source": str(src)})

    result = copy_verified(str(src), str(dst), expected_sha256=sha, chunk_size=CHUNK)

    assert result.resumed_from == 3 * CHUNK + 17
    assert result.bytes_copied == size - result.resumed_from
    assert dst.read_bytes() == src.read_bytes()
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize(
    "case",
    ["other sha256", "other size", "part longer than source", "no sidecar", "garbled sidecar"],
)
def test_stale_part_restarts_from_zero(tmp_path: Path, case: str) -> None:
    src, dst = tmp_path / "src.bin", tmp_path / "model.safetensors"
    size = 4 * CHUNK
    sha = make_file(src, size)
    sidecar: dict[str, object] = {"sha256": sha, "size": size}
    length = CHUNK
    if case == "other sha256":
        sidecar["sha256"] = hashlib.sha256(b"previous run").hexdigest()
    elif case == "other size":
        sidecar["size"] = size + 1
    interrupted(src, dst, length, sidecar)
    if case == "part longer than source":
        Path(f"{dst}.part").write_bytes(src.read_bytes() + b"extra")
    elif case == "no sidecar":
        Path(f"{dst}.part.json").unlink()
    elif case == "garbled sidecar":
        Path(f"{dst}.part.json").write_text("{not json")

    result = copy_verified(str(src), str(dst), expected_sha256=sha, chunk_size=CHUNK)

    assert (result.resumed_from, result.bytes_copied) == (0, size)
    assert dst.read_bytes() == src.read_bytes()
    assert leftovers(tmp_path) == []


def test_corrupt_prefix_is_recopied_from_zero(tmp_path: Path) -> None:
    """A part whose bytes were damaged (torn by a power loss) fails verification once resumed;
    the copy then starts over rather than blaming a good source."""
    src, dst = tmp_path / "src.bin", tmp_path / "model.safetensors"
    size = 4 * CHUNK
    sha = make_file(src, size)
    interrupted(src, dst, 2 * CHUNK, {"sha256": sha, "size": size})
    with open(f"{dst}.part", "r+b") as part:
        part.seek(CHUNK)
        part.write(b"\0" * 100)

    result = copy_verified(str(src), str(dst), expected_sha256=sha, chunk_size=CHUNK)

    assert result.resumed_from == 0
    assert result.bytes_copied == size + 2 * CHUNK  # the futile resumed tail, then everything
    assert dst.read_bytes() == src.read_bytes()
    assert leftovers(tmp_path) == []


SLOW_COPY = """
import io, os, sys, time
from fsspec import AbstractFileSystem
from fsspec.registry import register_implementation
from kubetrain.storage.verified_copy import copy_verified

class SlowFile(io.FileIO):
    def read(self, n=-1):
        time.sleep(0.02)
        return super().read(n)

class SlowFS(AbstractFileSystem):
    protocol = "slow"
    def info(self, path, **kwargs):
        return {"name": path, "size": os.path.getsize(path), "type": "file"}
    def _open(self, path, mode="rb", **kwargs):
        return SlowFile(path, "rb")

register_implementation("slow", SlowFS)
src, dst, sha, chunk = sys.argv[1:]
copy_verified("slow://" + src, dst, expected_sha256=sha, chunk_size=int(chunk))
"""


@pytest.mark.fault
def test_copy_killed_midway_resumes(tmp_path: Path, injected) -> None:
    """SIGKILL a real copy (its source slowed to 20 ms a chunk) once its part file has a few
    chunks, then copy again: it continues from where the killed one stopped."""
    src, dst = tmp_path / "src.bin", tmp_path / "out" / "model.safetensors"
    size = 64 * CHUNK
    sha = make_file(src, size)
    part = Path(f"{dst}.part")
    child = subprocess.Popen(
        [sys.executable, "-c", SLOW_COPY, str(src), str(dst), sha, str(CHUNK)], env=child_env()
    )
    try:
        deadline = time.monotonic() + 30
        while not (part.exists() and part.stat().st_size >= 4 * CHUNK):
            assert child.poll() is None, "the copy ended before it could be interrupted"
            assert time.monotonic() < deadline
            time.sleep(0.005)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert not dst.exists()
    left = part.stat().st_size
    assert 4 * CHUNK <= left < size
    injected.struck(f"the copy was SIGKILLed with {left} of {size} bytes written")

    result = copy_verified(str(src), str(dst), expected_sha256=sha, chunk_size=CHUNK)

    assert result.resumed_from == left
    assert result.bytes_copied == size - left
    injected.data_intact("the copied file", lambda: _same_bytes(dst, src))
    assert leftovers(dst.parent) == []


def _same_bytes(copy: Path, original: Path) -> None:
    assert copy.read_bytes() == original.read_bytes(), f"{copy} differs from {original}"


# -- object storage ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    pytest.importorskip("s3fs")
    from s3fs import S3FileSystem

    from tests.support.s3_server import s3_server  # moto: imported only when used

    with s3_server() as server, pytest.MonkeyPatch.context() as patch:
        for name, value in server.env().items():
            patch.setenv(name, value)
        S3FileSystem.clear_instance_cache()  # one cached for another server must not be reused
        server.create_bucket("ckpt")
        yield server
        S3FileSystem.clear_instance_cache()


def uploads_in_progress(server: S3Server, bucket: str) -> list[str]:
    """Multipart uploads neither completed nor aborted: what a sloppy failure would leave."""
    import boto3

    client = boto3.client("s3", endpoint_url=server.endpoint_url)  # keys from the environment
    return [u["Key"] for u in client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]


def test_s3_both_directions(tmp_path: Path, s3: S3Server) -> None:
    src, back = tmp_path / "src.bin", tmp_path / "back" / "model.safetensors"
    size = 7 * 1024 * 1024 + 3  # more than one 5 MiB part
    sha = make_file(src, size)
    key = "s3://ckpt/run1/model.safetensors"

    up = copy_verified(
        str(src), key, expected_sha256=sha, expected_size=size, chunk_size=1024 * 1024
    )
    assert (up.bytes_copied, up.resumed_from) == (size, 0)
    assert s3.keys("ckpt", "run1/") == ["run1/model.safetensors"]

    down = copy_verified(key, str(back), expected_sha256=sha, chunk_size=1024 * 1024)
    assert down.bytes_copied == size
    assert back.read_bytes() == src.read_bytes()
    assert leftovers(back.parent) == []

    again = copy_verified(str(src), key, expected_sha256=sha)
    assert again.bytes_copied == 0

    other = "s3://ckpt/run1/copy.safetensors"
    assert copy_verified(key, other, expected_sha256=sha).bytes_copied == size
    assert s3.keys("ckpt", "run1/") == ["run1/copy.safetensors", "run1/model.safetensors"]
    assert uploads_in_progress(s3, "ckpt") == []


def test_s3_source_to_local_resumes(tmp_path: Path, s3: S3Server) -> None:
    """Resuming depends only on the local part file; the S3 source is read from the offset."""
    src, dst = tmp_path / "src.bin", tmp_path / "out" / "model.safetensors"
    size = 3 * 1024 * 1024 + 11
    sha = make_file(src, size, seed=1)
    key = "s3://ckpt/resume/model.safetensors"
    copy_verified(str(src), key, expected_sha256=sha)
    dst.parent.mkdir()
    interrupted(src, dst, 1024 * 1024 + 5, {"sha256": sha, "size": size})

    result = copy_verified(key, str(dst), expected_sha256=sha, chunk_size=512 * 1024)

    assert (result.resumed_from, result.bytes_copied) == (1024 * 1024 + 5, size - 1024 * 1024 - 5)
    assert dst.read_bytes() == src.read_bytes()
    assert leftovers(dst.parent) == []


@pytest.mark.parametrize("size", [1000, 6 * 1024 * 1024], ids=["small", "multipart"])
def test_s3_mismatch_publishes_nothing(tmp_path: Path, s3: S3Server, size: int) -> None:
    src = tmp_path / "src.bin"
    make_file(src, size)
    key = f"s3://ckpt/bad-{size}/model.safetensors"
    wrong = hashlib.sha256(b"what the manifest said").hexdigest()

    with pytest.raises(IntegrityError, match=wrong):
        copy_verified(str(src), key, expected_sha256=wrong, chunk_size=1024 * 1024)

    assert s3.keys("ckpt", f"bad-{size}/") == []
    assert uploads_in_progress(s3, "ckpt") == []


def test_s3_target_with_other_content_is_replaced_once_verified(
    tmp_path: Path, s3: S3Server
) -> None:
    import fsspec

    src = tmp_path / "src.bin"
    sha = make_file(src, 2000)
    key = "s3://ckpt/replace/model.safetensors"
    fs = fsspec.filesystem("s3")
    fs.pipe(key, b"old")

    with pytest.raises(IntegrityError):
        copy_verified(str(src), key, expected_sha256="ab" * 32)
    fs.invalidate_cache()
    assert fs.cat(key) == b"old"

    copy_verified(str(src), key, expected_sha256=sha)
    fs.invalidate_cache()
    assert fs.cat(key) == src.read_bytes()
    assert s3.keys("ckpt", "replace/") == ["replace/model.safetensors"]


def test_other_object_store_stages_under_part(tmp_path: Path) -> None:
    """A store that is neither local nor S3 (fsspec's memory://) goes through ``<key>.part``."""
    import fsspec

    fs = fsspec.filesystem("memory")
    src = tmp_path / "src.bin"
    sha = make_file(src, 3 * CHUNK)
    try:
        with pytest.raises(IntegrityError):
            copy_verified(str(src), "memory://ckpt/m.bin", expected_sha256="cd" * 32)
        assert fs.find("/ckpt") == []

        result = copy_verified(str(src), "memory://ckpt/m.bin", expected_sha256=sha)
        assert result.bytes_copied == 3 * CHUNK
        assert fs.find("/ckpt") == ["/ckpt/m.bin"]
        assert fs.cat("/ckpt/m.bin") == src.read_bytes()
    finally:
        if fs.exists("/ckpt"):
            fs.rm("/ckpt", recursive=True)


# -- resources -----------------------------------------------------------------------------------

GIB = 1024**3


def fast_local_folder(tmp_path: Path) -> Path:
    """/dev/shm (tmpfs) when it has room, else ``tmp_path``: writing and fsyncing 1 GiB to this
    VM's disk takes ~5 s, to tmpfs ~1 s; neither's page cache counts in a process's RSS."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 4 * GIB:
        return Path(tempfile.mkdtemp(prefix="kubetrain-copy-", dir=shm))
    return tmp_path / "copy"


def test_one_gib_copy_has_bounded_peak_memory(tmp_path: Path) -> None:
    """Copy 1 GiB local to local in a grandchild process and read its peak RSS the way the brief
    asks, ``getrusage(RUSAGE_CHILDREN)`` after it exits: from a small launcher process, because
    Linux folds the forking parent's own peak (pytest's, with moto loaded) into a child's."""
    if shutil.disk_usage(tmp_path).free < 2 * GIB:
        pytest.skip("needs 2 GiB free")
    # Sparse, with a random MiB every 64 MiB: created instantly, read without disk I/O, and
    # no two 64 MiB stretches alike.
    src = tmp_path / "big.bin"
    zeros = memoryview(bytes(63 * 1024 * 1024))
    digest = hashlib.sha256()
    with open(src, "wb") as out:
        out.truncate(GIB)
        for offset in range(0, GIB, 64 * 1024 * 1024):
            noise = os.urandom(1024 * 1024)
            out.seek(offset)
            out.write(noise)
            digest.update(noise)
            digest.update(zeros)
    sha = digest.hexdigest()
    folder = fast_local_folder(tmp_path)
    dst = folder / "big.bin"
    copy = (
        "import json; from kubetrain.storage.verified_copy import copy_verified; "
        f"r = copy_verified({str(src)!r}, {str(dst)!r}, expected_sha256={sha!r}, "
        f"expected_size={GIB}); print(json.dumps([r.bytes_copied, r.sha256, r.seconds]))"
    )
    try:
        run = run_measuring_peak_memory([sys.executable, "-c", copy], env=child_env())
        assert run.returncode == 0, run.stderr
        copied, got_sha, seconds = json.loads(run.stdout)
        print(f"\n1 GiB copy: peak RSS {run.peak_mib:.0f} MiB, {GIB / 2**20 / seconds:.0f} MiB/s")
        assert (copied, got_sha) == (GIB, sha)
        assert dst.stat().st_size == GIB
        assert run.peak_mib < 256, f"peak RSS {run.peak_mib:.0f} MiB"
    finally:
        src.unlink(missing_ok=True)
        shutil.rmtree(folder, ignore_errors=True)


ENOSPC_COPY = """
import json, os, sys
from kubetrain.errors import IntegrityError, KubetrainError
from kubetrain.storage.verified_copy import copy_verified
src, dst, sha, folder = sys.argv[1:]
try:
    copy_verified(src, dst, expected_sha256=sha, chunk_size=256 * 1024)
    outcome = {"error": None}
except KubetrainError as exc:
    outcome = {"error": str(exc), "integrity": isinstance(exc, IntegrityError)}
outcome["left"] = sorted(os.listdir(folder))
print(json.dumps(outcome))
"""


@pytest.mark.fault
def test_disk_full_is_a_clear_error_and_leaves_nothing(tmp_path: Path, injected) -> None:
    """Copy 4 MiB onto a 1 MiB tmpfs mounted in a private user+mount namespace (no root, and
    the mount disappears with the namespace)."""
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    if not tiny_filesystem_available(mount_point):
        pytest.skip("cannot mount a tmpfs in a user namespace here (unshare -Urm)")
    src = tmp_path / "src.bin"
    sha = make_file(src, 4 * 1024 * 1024)
    dst = mount_point / "ckpt" / "model.safetensors"
    run = run_python_on_tiny_filesystem(
        mount_point,
        "1m",
        ["-c", ENOSPC_COPY, str(src), str(dst), sha, str(dst.parent)],
        env=child_env(),
    )
    assert run.returncode == 0, run.stderr
    outcome = json.loads(run.stdout)
    assert outcome["error"] is not None and not outcome["integrity"]
    assert "no space left" in outcome["error"]
    injected.struck("the target filesystem filled up mid-copy")
    assert str(dst) in outcome["error"] and "nothing was published" in outcome["error"]
    assert outcome["left"] == []
