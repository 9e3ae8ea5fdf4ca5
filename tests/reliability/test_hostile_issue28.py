"""Hostile review of issue 28 ("reliability by construction"), written from the user
documentation only: the README's Reliability section (its rules and the "Guards the code
cannot bypass"), the README's "Your own training code" and the ``--help`` of every command.
No source of kubetrain/, components/ or pipelines/ was read.

Six classes: (1) corrupt, half-written or lost models (files still being written, HF shards
without their index, broken checkpoints, the output rule around a promoted registry version),
(2) stray processes and hangs (children that detach, signals to a step, HTTP servers that
never answer or trickle), (3) tracebacks and unreadable answers (servers' JSON of the wrong
shape, unbounded JSON, corrupt job records), (4) bad input accepted, or refused only after
work was done (pre-flight), and good input refused (a program's arguments as typed),
(5) terminal escapes (C0, DEL, C1 such as U+009B from users, files, logs and servers) and
(6) races (two jobs or steps at once). A case that BROKE asserted the documented behaviour
under ``xfail(strict=True)``; 56 cases (80 ids) were tried, 40 held and 16 broke, and the 16
were fixed: an output inside a promoted version (1j-1m), SIGKILL to evaluate (2d), KFP
answers nested deep, a 500 health check and a run without an id (3b-3d), malformed
Kubernetes lists and watch answers (3e, 3f), --metrics-output under a file (4c), an empty
argument (4i, 4j), an absolute program path in `kubetrain run` (4k), launches racing for one
checkpoint folder (6a) and deletes racing for one job (6d).

Cheap by construction: steps run in process through ``kubetrain.cli.main`` where no process
boundary is the point; local jobs are tiny ``python -c`` programs under a per-test
``KUBETRAIN_LOCAL_ROOT`` and are deleted at the end; models are a 64-8-10 MLP saved with
``torch.save``; servers are an in-process stub answering every request alike.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from kubetrain.cli import main
from tests.support.processes import kubetrain_in_process as run_cli
from tests.support.processes import process_alive

HANG_SECONDS = 30
MARK = "KUBETRAIN_HOSTILE28_MARK"
ESCAPES = ("\x1b", "\x07", "\x7f", "\x9b")


# ------------------------------------------------------------------------------- helpers
def one_line(err: str, prog: str, *needles: str) -> str:
    """The single error line ``PROG: error: ...`` naming each needle."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line, got:\n{err}"
    assert lines[0].startswith(f"{prog}: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]}"
    assert "internal error" not in lines[0] and "Traceback" not in lines[0], lines[0]
    return lines[0]


def no_raw_escapes(text: str) -> None:
    for char in ESCAPES:
        assert char not in text, f"raw {char!r} reached the terminal: {text!r}"


def tree(root: Path) -> dict[str, bytes]:
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def tiny_state(seed: int = 0) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.ReLU(), nn.Linear(8, 10))
    return net.state_dict()


def aged(*paths: Path, seconds: float = 3600) -> None:
    """Set modification times an hour back: files long finished (no grace to wait out)."""
    for path in paths:
        os.utime(path, (time.time() - seconds, time.time() - seconds))


def save_pt(path: Path, seed: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(tiny_state(seed), path)
    aged(path)
    return path


def card(folder: Path) -> dict:
    return json.loads((folder / "model.json").read_text())


def left_running(mark: str) -> list[str]:
    """Processes still running that carry this test's ``MARK`` in their environment."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get(MARK) == mark and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(" ".join(proc.cmdline()[:4]))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not process_alive(pid):
            return True
        time.sleep(0.05)
    return not process_alive(pid)


def read_pid(path: Path, seconds: float = 10) -> int:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return int(path.read_text())
        time.sleep(0.05)
    raise TimeoutError(f"no pid in {path}")


def kubetrain_popen(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, pipes: bool = True
):
    return subprocess.Popen(
        [sys.executable, "-m", "kubetrain", *map(str, args)],
        stdout=subprocess.PIPE if pipes else subprocess.DEVNULL,
        stderr=subprocess.PIPE if pipes else subprocess.DEVNULL,
        text=True,
        cwd=cwd,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )


@pytest.fixture
def mark(monkeypatch: pytest.MonkeyPatch) -> str:
    value = uuid.uuid4().hex
    monkeypatch.setenv(MARK, value)
    return value


@pytest.fixture
def jobs(local_root: Path, mark: str) -> Iterator[Path]:
    """``KUBETRAIN_LOCAL_ROOT`` of this test; every job under it is deleted at the end and
    every process the test started is stopped."""
    yield local_root
    if local_root.exists():
        for job in sorted(local_root.iterdir()):
            try:
                main(["delete", "--ignore-not-found", job.name])
            except SystemExit:
                pass
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get(MARK) == mark and proc.pid != os.getpid():
                proc.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """A model `kubetrain collect` published from a torch.save'd state dict."""
    root = tmp_path_factory.mktemp("model")
    save_pt(root / "ck" / "model.pt")
    assert main(["collect", "--checkpoint-dir", str(root / "ck"), "--output",
                 str(root / "m")]) == 0  # fmt: skip
    return root / "m"


@pytest.fixture
def registry(model: Path, tmp_path: Path, capsys) -> Path:
    """A registry holding version v1 of ``model`` and PROMOTED pointing at it."""
    reg = tmp_path / "reg"
    code, out, err = run_cli(["promote", "--model", model, "--registry", reg, "--version", "v1"],
                             capsys)  # fmt: skip
    assert code == 0, err
    assert (reg / "PROMOTED").is_file()
    return reg


METRICS_PROGRAM = textwrap.dedent(
    """
    import json, os, sys
    body = open(sys.argv[1], "rb").read() if len(sys.argv) > 1 else b'{"loss": 0.1}'
    open(os.environ["KUBETRAIN_METRICS_FILE"], "wb").write(body)
    """
)


def evaluate_own(capsys, model: Path, program: list[str], *extra: Any) -> tuple[int, str, str]:
    return run_cli(["evaluate", "--model", model, "--metric", "loss", "--below", "1", *extra,
                    "--", *program], capsys)  # fmt: skip


# ------------------------------------------------------------------- an HTTP server stub
class Stub:
    """An HTTP server answering every request alike: ``answer`` (status, content type, body),
    or ``hang`` (never a byte), or ``trickle`` (headers, then a byte a second)."""

    def __init__(self, mode: str = "answer", status: int = 200,
                 ctype: str = "application/json", body: bytes = b"{}") -> None:  # fmt: skip
        self.mode, self.status, self.ctype, self.body = mode, status, ctype, body
        self.requests: list[str] = []
        self.stop = threading.Event()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def handle_one_request(self) -> None:
                try:
                    super().handle_one_request()
                except OSError:
                    self.close_connection = True

            def respond(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                stub.requests.append(f"{self.command} {self.path}")
                if stub.mode == "hang":
                    stub.stop.wait(HANG_SECONDS)
                    self.close_connection = True
                    return
                if stub.mode == "trickle":
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", "100000")
                    self.end_headers()
                    for _ in range(HANG_SECONDS):
                        if stub.stop.wait(1):
                            break
                        self.wfile.write(b" ")
                        self.wfile.flush()
                    self.close_connection = True
                    return
                self.send_response(stub.status)
                self.send_header("Content-Type", stub.ctype)
                self.send_header("Content-Length", str(len(stub.body)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(stub.body)
                self.close_connection = True

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = respond

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub(monkeypatch) -> Iterator[Any]:
    """``stub(mode, status, ctype, body)`` starts a Stub; every Argo variable cleared and
    kubetrain's HTTP deadline set to 1 s (KUBETRAIN_HTTP_TIMEOUT_SECONDS, which the line of
    a timeout names)."""
    for name in list(os.environ):
        if name.startswith("ARGO_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("KUBETRAIN_HTTP_TIMEOUT_SECONDS", "1")
    started: list[Stub] = []

    def start(*args: Any, **kwargs: Any) -> Stub:
        started.append(Stub(*args, **kwargs))
        return started[-1]

    yield start
    for server in started:
        server.close()


def kubeconfig_for(url: str, path: Path) -> Path:
    path.write_text(textwrap.dedent(f"""
        apiVersion: v1
        kind: Config
        clusters:
        - cluster: {{server: "{url}"}}
          name: stub
        contexts:
        - context: {{cluster: stub, user: stub, namespace: default}}
          name: stub
        current-context: stub
        users:
        - name: stub
          user: {{token: abc}}
        """))  # fmt: skip
    return path


# ============================================ 1. corrupt, half-written or lost models
def test_1a_a_file_held_open_for_writing_is_passed_over_for_the_finished_one(tmp_path, capsys):
    ck = tmp_path / "ck"
    save_pt(ck / "model_epoch_1.pt", seed=1)
    payload = (save_pt(tmp_path / "src" / "m.pt", seed=2)).read_bytes()
    writer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, sys, time
        f = open({str(ck / "model_epoch_2.pt")!r}, "wb")
        f.write({payload!r}); f.flush()
        os.utime({str(ck / "model_epoch_2.pt")!r}, (time.time() - 3600, time.time() - 3600))
        print("ready", flush=True)
        time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert writer.stdout.readline().strip() == "ready"
        code, out, err = run_cli(["collect", "--checkpoint-dir", ck, "--output",
                                  tmp_path / "out"], capsys)  # fmt: skip
    finally:
        writer.kill()
        writer.wait()
    assert code == 0, err
    assert card(tmp_path / "out")["source_file"] == "model_epoch_1.pt"


def test_1b_a_file_mapped_writable_with_its_descriptor_closed_is_not_taken(tmp_path, capsys):
    ck = tmp_path / "ck"
    save_pt(ck / "model_epoch_1.pt", seed=1)
    payload = (save_pt(tmp_path / "src" / "m.pt", seed=2)).read_bytes()
    target = ck / "model_epoch_2.pt"
    writer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import mmap, os, time
        data = {payload!r}
        fd = os.open({str(target)!r}, os.O_RDWR | os.O_CREAT)
        os.ftruncate(fd, len(data))
        m = mmap.mmap(fd, len(data)); os.close(fd)
        m[:] = data; m.flush()
        os.utime({str(target)!r}, (time.time() - 3600, time.time() - 3600))
        print("ready", flush=True)
        time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert writer.stdout.readline().strip() == "ready"
        code, out, err = run_cli(["collect", "--checkpoint-dir", ck, "--output",
                                  tmp_path / "out"], capsys)  # fmt: skip
    finally:
        writer.kill()
        writer.wait()
    assert code == 0, err
    assert card(tmp_path / "out")["source_file"] == "model_epoch_1.pt"


def test_1c_a_file_growing_by_appends_that_close_each_time_is_not_taken(tmp_path, capsys):
    ck = tmp_path / "ck"
    save_pt(ck / "model_epoch_1.pt", seed=1)
    payload = (save_pt(tmp_path / "src" / "m.pt", seed=2)).read_bytes()
    target = ck / "model_epoch_2.pt"
    writer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        data = {payload!r}
        for i in range(100):
            with open({str(target)!r}, "ab") as f:
                f.write(data[i * 100:(i + 1) * 100])
            if i == 0:
                print("ready", flush=True)
            time.sleep(0.3)
        """)], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert writer.stdout.readline().strip() == "ready"
        code, out, err = run_cli(["collect", "--checkpoint-dir", ck, "--output",
                                  tmp_path / "out"], capsys)  # fmt: skip
    finally:
        writer.kill()
        writer.wait()
    assert code == 0, err
    assert card(tmp_path / "out")["source_file"] == "model_epoch_1.pt"


def hf_shards(folder: Path, index: bool = True, drop_second: bool = False) -> Path:
    state = {k: v.contiguous() for k, v in tiny_state().items()}
    keys = list(state)
    halves = ({k: state[k] for k in keys[:2]}, {k: state[k] for k in keys[2:]})
    names = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
    folder.mkdir(parents=True)
    for half, name in zip(halves, names, strict=True):
        save_file(half, folder / name)
    if index:
        weight_map = {k: names[0] for k in halves[0]} | {k: names[1] for k in halves[1]}
        (folder / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": weight_map})
        )
    if drop_second:
        (folder / names[1]).unlink()
    aged(*folder.iterdir())
    return folder


def test_1d_hf_shards_without_their_index_are_a_save_in_progress(tmp_path, capsys):
    ck = hf_shards(tmp_path / "ck", index=False)
    code, out, err = run_cli(["collect", "--checkpoint-dir", ck, "--output", tmp_path / "out"],
                             capsys)  # fmt: skip
    assert code != 0
    one_line(err, "kubetrain collect", "model.safetensors.index.json")
    assert not (tmp_path / "out").exists()


def test_1e_an_hf_index_naming_a_shard_not_there_is_refused(tmp_path, capsys):
    ck = hf_shards(tmp_path / "ck", drop_second=True)
    code, out, err = run_cli(["collect", "--checkpoint-dir", ck, "--output", tmp_path / "out"],
                             capsys)  # fmt: skip
    assert code != 0
    one_line(err, "kubetrain collect", "model-00002-of-00002.safetensors")
    assert not (tmp_path / "out").exists()


def test_1f_naming_one_shard_with_checkpoint_file_does_not_bypass_the_index(tmp_path, capsys):
    ck = hf_shards(tmp_path / "ck", index=False)
    code, out, err = run_cli(["collect", "--checkpoint-dir", ck, "--checkpoint-file",
                              "model-00001-of-00002.safetensors", "--output", tmp_path / "out"],
                             capsys)  # fmt: skip
    assert code != 0
    one_line(err, "kubetrain collect", "model.safetensors.index.json")
    assert not (tmp_path / "out").exists()


def test_1g_a_truncated_torch_save_is_one_line_and_nothing_is_published(tmp_path, capsys):
    whole = save_pt(tmp_path / "src" / "m.pt").read_bytes()
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "model.pt").write_bytes(whole[: len(whole) // 2])
    aged(tmp_path / "ck" / "model.pt")
    code, out, err = run_cli(["collect", "--checkpoint-dir", tmp_path / "ck", "--output",
                              tmp_path / "out"], capsys)  # fmt: skip
    assert code != 0
    one_line(err, "kubetrain collect", "model.pt")
    assert not (tmp_path / "out").exists()


def test_1h_a_diverged_model_is_refused_naming_its_tensor(tmp_path, capsys):
    state = tiny_state()
    state["1.weight"][0, 0] = float("nan")
    (tmp_path / "ck").mkdir()
    torch.save(state, tmp_path / "ck" / "model.pt")
    aged(tmp_path / "ck" / "model.pt")
    code, out, err = run_cli(["collect", "--checkpoint-dir", tmp_path / "ck", "--output",
                              tmp_path / "out"], capsys)  # fmt: skip
    assert code != 0
    one_line(err, "kubetrain collect", "1.weight", "NaN")
    assert not (tmp_path / "out").exists()


@pytest.mark.security
@pytest.mark.parametrize(
    "header",
    [struct.pack("<Q", 2**63) + b"{}",
     struct.pack("<Q", 66) + b'{"w": {"dtype": "F32", "shape": [1e400], "data_offsets": [0, 4]}}'
     + b"\0" * 4],
    ids=["header-length-2**63", "shape-1e400"],
)  # fmt: skip
def test_1i_a_hostile_safetensors_header_is_one_line(tmp_path, capsys, header):
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "model.safetensors").write_bytes(header)
    aged(tmp_path / "ck" / "model.safetensors")
    code, out, err = run_cli(["collect", "--checkpoint-dir", tmp_path / "ck", "--output",
                              tmp_path / "out"], capsys)  # fmt: skip
    assert code != 0
    one_line(err, "kubetrain collect", "model.safetensors")
    assert not (tmp_path / "out").exists()


@pytest.mark.bad_input
def test_1j_collect_never_publishes_inside_a_promoted_version(registry, tmp_path, capsys):
    before = tree(registry / "v1")
    save_pt(tmp_path / "ck" / "model.pt", seed=3)
    code, out, err = run_cli(["collect", "--checkpoint-dir", tmp_path / "ck", "--output",
                              registry / "v1" / "sub"], capsys)  # fmt: skip
    assert tree(registry / "v1") == before, "the promoted version was written into"
    assert code == 2
    one_line(err, "kubetrain collect", "registry")


@pytest.mark.bad_input
def test_1k_prep_never_publishes_inside_a_promoted_version(registry, capsys):
    before = tree(registry / "v1")
    code, out, err = run_cli(["prep", "--output", registry / "v1" / "data"], capsys)
    assert tree(registry / "v1") == before, "the promoted version was written into"
    assert code == 2
    one_line(err, "kubetrain prep", "registry")


@pytest.mark.bad_input
def test_1l_promote_never_makes_a_registry_inside_a_promoted_version(registry, model, capsys):
    before = tree(registry / "v1")
    code, out, err = run_cli(["promote", "--model", model, "--registry", registry / "v1",
                              "--version", "v2"], capsys)  # fmt: skip
    assert tree(registry / "v1") == before, "the promoted version was written into"
    assert code == 2
    one_line(err, "kubetrain promote", "registry")


@pytest.mark.bad_input
def test_1m_evaluate_never_publishes_its_report_inside_a_promoted_version(
    registry, model, digits_dir, tmp_path, capsys, monkeypatch
):
    (tmp_path / "hostile28_net.py").write_text(textwrap.dedent("""
        from torch import nn
        def build(shape, classes):
            return nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.ReLU(), nn.Linear(8, 10))
        """))  # fmt: skip
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    before = tree(registry / "v1")
    code, out, err = run_cli(["evaluate", "--model", model, "--data", digits_dir,
                              "--model-factory", "hostile28_net:build", "--report",
                              registry / "v1" / "report", "--no-fail-below-threshold"],
                             capsys)  # fmt: skip
    assert tree(registry / "v1") == before, "the promoted version was written into"
    assert code == 2
    one_line(err, "kubetrain evaluate", "registry")


@pytest.mark.bad_input
@pytest.mark.security
def test_1n_a_link_to_a_promoted_version_is_no_output(registry, tmp_path, capsys):
    (tmp_path / "alias").symlink_to(registry / "v1")
    save_pt(tmp_path / "ck" / "model.pt", seed=3)
    before = tree(registry)
    code, out, err = run_cli(["collect", "--checkpoint-dir", tmp_path / "ck", "--output",
                              tmp_path / "alias"], capsys)  # fmt: skip
    assert code == 2
    one_line(err, "kubetrain collect", "registry")
    assert tree(registry) == before


@pytest.mark.bad_input
def test_1o_an_output_that_holds_the_checkpoint_folder_is_refused(model, tmp_path, capsys):
    out_dir = tmp_path / "m"
    shutil.copytree(model, out_dir)
    save_pt(out_dir / "ck" / "model.pt", seed=3)
    before = tree(out_dir)
    code, out, err = run_cli(["collect", "--checkpoint-dir", out_dir / "ck", "--output",
                              out_dir], capsys)  # fmt: skip
    assert code == 2
    one_line(err, "kubetrain collect", "checkpoint_dir")
    assert tree(out_dir) == before


# ====================================================== 2. stray processes and hangs
DETACHING = textwrap.dedent(
    """
    import os, subprocess, sys, time
    pidfile, how = sys.argv[1], sys.argv[2]
    setsid = {setsid!r}
    if how == "double-fork":
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                open(pidfile, "w").write(str(os.getpid()))
                time.sleep(60)
            os._exit(0)
    else:  # env -i: no job identity in its environment, a session of its own
        subprocess.Popen(["env", "-i", setsid, "-f", "/bin/sh", "-c",
                          "echo $$ > " + pidfile + "; exec sleep 60"])
    while not (os.path.exists(pidfile) and open(pidfile).read().strip()):
        time.sleep(0.05)
    print("left a child behind", flush=True)
    """
).format(setsid=shutil.which("setsid") or "/usr/bin/setsid")


@pytest.mark.parametrize("how", ["double-fork", "env-i"])
def test_2a_a_child_that_detaches_does_not_outlive_a_complete_job(jobs, tmp_path, capsys, how):
    (tmp_path / "detach.py").write_text(DETACHING)
    pidfile = tmp_path / "child.pid"
    code, out, err = run_cli(["launch", "--name", "detach", "--nodes", 1, "--", sys.executable,
                              tmp_path / "detach.py", pidfile, how], capsys)  # fmt: skip
    assert code == 0, err
    child = read_pid(pidfile)
    code, out, err = run_cli(["wait", "detach"], capsys)
    assert code == 0, err
    assert gone_within(child, 1), f"{how} child {child} outlived the job"


def test_2b_evaluate_s_program_leaves_nothing_running(model, tmp_path, capsys, mark):
    program = tmp_path / "eval.py"
    program.write_text(METRICS_PROGRAM + textwrap.dedent(f"""
        import subprocess
        subprocess.Popen([{shutil.which("setsid")!r}, "-f", "/bin/sh", "-c",
                          "echo $$ > {tmp_path / "child.pid"}; exec sleep 60"])
        while not os.path.exists({str(tmp_path / "child.pid")!r}):
            pass
        """))  # fmt: skip
    code, out, err = evaluate_own(capsys, model, [sys.executable, program])
    assert code == 0, err
    assert gone_within(read_pid(tmp_path / "child.pid"), 1)
    assert left_running(mark) == []


SLEEPER = textwrap.dedent(
    """
    import subprocess, sys, time
    subprocess.Popen(["/bin/sh", "-c", "echo $$ > " + sys.argv[1] + "; exec sleep 60"])
    time.sleep(60)
    """
)


def test_2c_sigterm_to_evaluate_stops_its_program_and_exits_143(model, tmp_path, mark):
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    pidfile = tmp_path / "child.pid"
    step = kubetrain_popen("evaluate", "--model", model, "--metric", "loss", "--below", 1,
                           "--", sys.executable, tmp_path / "sleeper.py", pidfile)  # fmt: skip
    child = read_pid(pidfile, 20)
    step.send_signal(signal.SIGTERM)
    out, err = step.communicate(timeout=15)
    assert step.returncode == 143, err
    one_line(err, "kubetrain evaluate", "SIGTERM")
    assert gone_within(child, 1)
    assert left_running(mark) == []


def test_2d_sigkill_to_evaluate_leaves_no_program_running(model, tmp_path, mark):
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    pidfile = tmp_path / "child.pid"
    step = kubetrain_popen("evaluate", "--model", model, "--metric", "loss", "--below", 1,
                           "--", sys.executable, tmp_path / "sleeper.py", pidfile,
                           pipes=False)  # fmt: skip
    try:
        child = read_pid(pidfile, 20)
        step.kill()
        step.wait(10)
        assert gone_within(child, 3), "the program's child outlived the step"
        deadline = time.monotonic() + 3  # the owner exits only after its program's tree
        while left_running(mark) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert left_running(mark) == []
    finally:
        for proc in psutil.process_iter(["pid"]):
            try:
                if proc.environ().get(MARK) == mark and proc.pid != os.getpid():
                    proc.kill()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue


def test_2e_a_silent_job_is_stopped_by_the_stall_timeout(jobs, capsys, mark):
    code, out, err = run_cli(["launch", "--name", "silent", "--nodes", 2, "--", sys.executable,
                              "-c", "import time; time.sleep(60)"], capsys)  # fmt: skip
    assert code == 0, err
    started = time.monotonic()
    code, out, err = run_cli(["wait", "silent", "--stall-timeout", 1], capsys)
    assert code == 3
    one_line(err, "kubetrain wait", "stalled")
    assert time.monotonic() - started < 10
    assert left_running(mark) == []


@pytest.mark.usefixtures("no_hang")
def test_2f_an_argo_server_that_never_answers_fails_within_the_deadline(stub, capsys):
    server = stub("hang")
    started = time.monotonic()
    code, out, err = run_cli(["submit", "argo", "--host", server.url], capsys)
    assert code != 0
    one_line(err, "kubetrain submit", server.url, "1s")
    assert time.monotonic() - started < 8


@pytest.mark.usefixtures("no_hang")
def test_2g_a_kfp_server_trickling_a_byte_a_second_hits_the_whole_exchange_deadline(stub, capsys):
    server = stub("trickle")
    started = time.monotonic()
    code, out, err = run_cli(["submit", "kfp", "--host", server.url], capsys)
    assert code != 0
    assert "KFP" in err and server.url in err, err
    assert "Traceback" not in err and "internal error" not in err
    assert time.monotonic() - started < 8


@pytest.mark.security
@pytest.mark.bad_input
@pytest.mark.usefixtures("no_hang")
def test_2h_a_token_file_that_is_a_fifo_is_refused_without_blocking(stub, tmp_path, capsys):
    server = stub()
    os.mkfifo(tmp_path / "token")
    code, out, err = run_cli(["submit", "argo", "--host", server.url, "--token-file",
                              tmp_path / "token"], capsys)  # fmt: skip
    assert code == 2
    one_line(err, "kubetrain submit", "--token-file")
    assert server.requests == []


# ============================================== 3. tracebacks and unreadable answers
def test_3a_an_argo_200_holding_a_login_page_is_one_line_naming_the_server(stub, capsys):
    server = stub(ctype="text/html", body=b"<html><body>Sign in</body></html>")
    code, out, err = run_cli(["submit", "argo", "--host", server.url], capsys)
    assert code != 0
    one_line(err, "kubetrain submit", server.url, "text/html")


def test_3b_kfp_json_nested_too_deep_is_read_bounded(stub, capsys):
    server = stub(body=b"[" * 100000 + b"]" * 100000)
    code, out, err = run_cli(["submit", "kfp", "--host", server.url], capsys)
    assert code != 0
    one_line(err, "kubetrain submit", server.url, "nested more than 64 deep")


def test_3c_a_failed_kfp_health_check_names_the_servers_last_answer(stub, capsys):
    server = stub(status=500, ctype="text/plain", body=b"database is locked")
    code, out, err = run_cli(["submit", "kfp", "--host", server.url], capsys)
    assert code != 0
    line = one_line(err, "kubetrain submit", server.url)
    assert "500" in line or "database is locked" in line, line


def test_3d_a_kfp_answer_without_a_run_id_is_no_created_run(stub, capsys):
    server = stub(body=b"{}")
    code, out, err = run_cli(["submit", "kfp", "--host", server.url], capsys)
    assert "None" not in out, out
    assert code != 0
    one_line(err, "kubetrain submit", server.url)


def test_3e_a_trainjob_list_of_the_wrong_shape_is_one_line_naming_the_api(
    stub, tmp_path, capsys, monkeypatch
):
    server = stub(body=json.dumps({"kind": "TrainJobList", "apiVersion":
                                   "trainer.kubeflow.org/v1alpha1", "metadata": {},
                                   "items": [1, "x", None]}).encode())  # fmt: skip
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig_for(server.url, tmp_path / "config")))
    code, out, err = run_cli(["list", "--backend", "trainer"], capsys)
    assert code != 0
    one_line(err, "kubetrain list", server.url)


def test_3f_a_trainjob_answer_of_the_wrong_shape_is_one_line_from_wait(
    stub, tmp_path, capsys, monkeypatch
):
    server = stub(body=b'{"kind": "TrainJobList", "items": "nope"}')
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig_for(server.url, tmp_path / "config")))
    code, out, err = run_cli(["wait", "--backend", "trainer", "demo", "--timeout", 3], capsys)
    assert code != 0
    one_line(err, "kubetrain wait", server.url)


def test_3g_a_kubernetes_answer_holding_1e400_is_one_line(stub, tmp_path, capsys, monkeypatch):
    server = stub(body=b'{"kind": "TrainJobList", "items": [], "n": 1e400}')
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig_for(server.url, tmp_path / "config")))
    code, out, err = run_cli(["list", "--backend", "trainer"], capsys)
    assert code != 0
    one_line(err, "kubetrain list", server.url, "1e400")


METRICS_FILES = {
    "nan": b'{"loss": NaN}',
    "deep": b'{"loss": 0.1, "x": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    "5000-digits": b'{"loss": ' + b"9" * 5000 + b"}",
    "not-utf8": b'{"loss": 0.1, "\xff": 1}',
    "bool": b'{"loss": true}',
    "nul-after": b'{"loss": 0.1}\x00',
}


@pytest.mark.bad_input
@pytest.mark.parametrize("kind", list(METRICS_FILES))
def test_3h_a_hostile_metrics_file_is_one_line_naming_metrics(model, tmp_path, capsys, kind):
    (tmp_path / "metrics.json").write_bytes(METRICS_FILES[kind])
    (tmp_path / "eval.py").write_text(METRICS_PROGRAM)
    code, out, err = evaluate_own(capsys, model, [sys.executable, tmp_path / "eval.py",
                                                  tmp_path / "metrics.json"])  # fmt: skip
    assert code == 2, out
    one_line(err, "kubetrain evaluate", "metrics")


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("old", "new"),
    [('"num_classes": 10', '"num_classes": ' + "1" * 5000), ('"seed": 0', '"seed": ' + "[" * 200
     + "]" * 200), ('"source": "sklearn:digits"', '"source": 1e400')],
    ids=["5000-digits", "deep", "1e400"],
)  # fmt: skip
def test_3i_a_hostile_dataset_manifest_is_one_line(model, digits_dir, tmp_path, capsys, old, new):
    data = tmp_path / "data"
    shutil.copytree(digits_dir, data)
    text = (data / "manifest.json").read_text()
    compact = json.dumps(json.loads(text), indent=2)
    assert old in compact, compact[:400]
    (data / "manifest.json").write_text(compact.replace(old, new))
    code, out, err = run_cli(["evaluate", "--model", model, "--data", data], capsys)
    assert code != 0
    one_line(err, "kubetrain evaluate", "manifest.json")


def test_3j_a_job_with_a_corrupt_status_record_waits_in_one_line_and_deletes(jobs, capsys, mark):
    code, out, err = run_cli(["launch", "--name", "corrupt", "--nodes", 1, "--",
                              sys.executable, "-c", "import time; time.sleep(60)"],
                             capsys)  # fmt: skip
    assert code == 0, err
    time.sleep(0.5)
    (jobs / "corrupt" / "status.json").write_text("[" * 10000 + "]" * 10000)
    code, out, err = run_cli(["wait", "corrupt", "--timeout", 3], capsys)
    assert code != 0
    one_line(err, "kubetrain wait", "status.json")
    code, out, err = run_cli(["delete", "corrupt"], capsys)
    assert code == 0, err
    assert not (jobs / "corrupt").exists() and left_running(mark) == []


# ============================ 4. bad input refused before any work; good input refused
@pytest.mark.bad_input
@pytest.mark.parametrize("where", ["file", "under-file", "url"])
def test_4a_launch_checks_output_parameters_before_creating_a_job(jobs, tmp_path, capsys, where):
    (tmp_path / "afile").write_text("x")
    target = {"file": tmp_path / "afile", "under-file": tmp_path / "afile" / "out",
              "url": "http://example.invalid/out"}[where]  # fmt: skip
    code, out, err = run_cli(["launch", "--name", "early", "--nodes", 1, "--output-parameters",
                              target, "--", sys.executable, "-c", "pass"], capsys)  # fmt: skip
    assert code == 2
    one_line(err, "kubetrain launch", "--output-parameters")
    assert not jobs.exists() or list(jobs.iterdir()) == []


@pytest.mark.bad_input
def test_4b_evaluate_reads_the_model_card_before_its_program_runs(tmp_path, capsys):
    marker = tmp_path / "ran"
    (tmp_path / "empty-model").mkdir()
    code, out, err = evaluate_own(
        capsys, tmp_path / "empty-model", [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    )
    assert code == 2
    one_line(err, "kubetrain evaluate", "--model", "model.json")
    assert not marker.exists(), "the program ran before the refusal"


@pytest.mark.bad_input
def test_4c_evaluate_checks_metrics_output_before_its_program_runs(model, tmp_path, capsys):
    marker = tmp_path / "ran"
    (tmp_path / "afile").write_text("x")
    (tmp_path / "eval.py").write_text(METRICS_PROGRAM + f"open({str(marker)!r}, 'w')\n")
    code, out, err = evaluate_own(
        capsys,
        model,
        [sys.executable, tmp_path / "eval.py"],
        "--metrics-output",
        tmp_path / "afile" / "m.json",
    )
    assert not marker.exists(), "the program ran before the refusal"
    assert code == 2
    one_line(err, "kubetrain evaluate", "metrics")


RUN_REFUSALS = {
    "registry-a-file": (["--registry", "{afile}"], "--registry"),
    "storage-a-file": (["--storage", "{afile}"], "--storage"),
    "output-under-a-file": (["--output", "{afile}/x"], "--output"),
    "local-root-under-a-file": ([], "KUBETRAIN_LOCAL_ROOT"),
    "program-not-on-path": (["--", "no-such-program-h28", "train.py"], "no-such-program-h28"),
}


@pytest.mark.bad_input
@pytest.mark.parametrize("case", list(RUN_REFUSALS))
def test_4d_run_refuses_before_prep_writes(jobs, tmp_path, capsys, monkeypatch, case):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    (tmp_path / "hostile28_net.py").write_text("def build(shape, classes):\n    raise SystemExit\n")
    extra, needle = RUN_REFUSALS[case]
    extra = [a.format(afile=tmp_path / "afile") for a in extra]
    if case == "local-root-under-a-file":
        monkeypatch.setenv("KUBETRAIN_LOCAL_ROOT", str(tmp_path / "afile" / "jobs"))
    program = extra[extra.index("--") :] if "--" in extra else ["--", sys.executable, "-c", "0"]
    options = extra[: extra.index("--")] if "--" in extra else extra
    if "--output" not in options:
        options += ["--output", tmp_path / "runs"]
    code, out, err = run_cli(["run", "--model", "hostile28_net:build", "--epochs", 1, *options,
                              *program], capsys)  # fmt: skip
    assert code == 2, out
    one_line(err, "kubetrain run", needle)
    assert not (tmp_path / "runs").exists() and not jobs.exists()


def run_tiny(tmp_path: Path, local_root: Path, *command: Any) -> subprocess.CompletedProcess:
    """`kubetrain run` of a 40-sample dataset with ``-- COMMAND``, as a user runs it; every
    job it left is deleted by the caller (``delete_all``)."""
    x = np.random.default_rng(0).random((40, 4), dtype=np.float32)
    np.savez(tmp_path / "tiny.npz", x=x, y=np.arange(40) % 2)
    (tmp_path / "hostile28_net.py").write_text("def build(shape, classes):\n    raise SystemExit\n")
    return subprocess.run(
        [sys.executable, "-m", "kubetrain", "run", "--dataset", tmp_path / "tiny.npz",
         "--model", "hostile28_net:build", "--output", tmp_path / "runs", "--epochs", "1",
         "--", *map(str, command)],
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
        env={**os.environ, "KUBETRAIN_LOCAL_ROOT": str(local_root), "OMP_NUM_THREADS": "1"},
    )  # fmt: skip


def delete_all(local_root: Path) -> None:
    if local_root.exists():
        for job in local_root.iterdir():
            main(["delete", "--ignore-not-found", job.name])


def test_4k_run_runs_a_program_given_by_its_absolute_path_as_typed(tmp_path, local_root):
    try:
        result = run_tiny(tmp_path, local_root, sys.executable, "-c", "print('as typed')")
        assert "not found on PATH" not in result.stderr, result.stderr
        assert "launch-trainjob failed" not in result.stdout + result.stderr
        logs = [p.read_text() for p in local_root.rglob("node-0.log")]
        assert any("as typed" in log for log in logs), logs
    finally:
        delete_all(local_root)


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("param", "needle"),
    [('command=["python", "a\\u0000b"]', "NUL"),
     ('command=["torchrun", "train.py"]', "model"),
     ("dataset_source=nosuch:thing", "dataset_source"),
     ("lr=1e400", "lr")],
    ids=["command-nul", "command-with-mlp", "dataset-source", "lr-1e400"],
)  # fmt: skip
def test_4f_submit_kfp_checks_command_and_dataset_source_before_contacting(
    stub, capsys, param, needle
):
    server = stub()
    code, out, err = run_cli(["submit", "kfp", "--host", server.url, "--param", param], capsys)
    assert code == 2, out
    one_line(err, "kubetrain submit", needle)
    assert server.requests == []


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "command_json",
    ["[" * 5000 + "]" * 5000, '["python", 1e400]', '["python", NaN]', '["py\\u0000thon"]'],
    ids=["deep", "1e400", "nan", "nul"],
)
def test_4g_a_hostile_command_json_creates_no_job(jobs, capsys, command_json):
    code, out, err = run_cli(["launch", "--name", "cj", "--nodes", 1, "--command-json",
                              command_json], capsys)  # fmt: skip
    assert code == 2
    one_line(err, "kubetrain launch", "--command-json")
    assert not jobs.exists() or list(jobs.iterdir()) == []


ARGV_PROGRAM = textwrap.dedent(
    """
    import json, os, sys
    json.dump(sys.argv[1:], open(os.environ["H28_ARGV"], "w"))
    if "KUBETRAIN_METRICS_FILE" in os.environ:
        json.dump({"loss": 0.1}, open(os.environ["KUBETRAIN_METRICS_FILE"], "w"))
    """
)
TYPED = ["--out", "model.pt", "a b", "$HOME", "*", ";ls", "--", "--name", "x", "-h", "../x"]


def test_4h_a_launched_programs_arguments_arrive_as_typed(jobs, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("H28_ARGV", str(tmp_path / "argv.json"))
    (tmp_path / "prog.py").write_text(ARGV_PROGRAM)
    (tmp_path / "model.pt").write_text("mine")
    code, out, err = run_cli(["launch", "--name", "typed", "--nodes", 1, "--", sys.executable,
                              "prog.py", *TYPED, ""], capsys)  # fmt: skip
    assert code == 0, err
    assert run_cli(["wait", "typed"], capsys)[0] == 0
    assert json.loads((tmp_path / "argv.json").read_text()) == [*TYPED, ""]
    assert (tmp_path / "model.pt").read_text() == "mine"


def test_4i_an_empty_argument_reaches_evaluate_s_program(model, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("H28_ARGV", str(tmp_path / "argv.json"))
    (tmp_path / "prog.py").write_text(ARGV_PROGRAM)
    code, out, err = evaluate_own(capsys, model, [sys.executable, tmp_path / "prog.py",
                                                  "--prefix", ""])  # fmt: skip
    assert code == 0, err
    assert json.loads((tmp_path / "argv.json").read_text()) == ["--prefix", ""]


def test_4j_command_json_passes_an_empty_argument_like_dashes_do(
    jobs, tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("H28_ARGV", str(tmp_path / "argv.json"))
    (tmp_path / "prog.py").write_text(ARGV_PROGRAM)
    command = json.dumps([sys.executable, str(tmp_path / "prog.py"), "--prefix", ""])
    code, out, err = run_cli(["launch", "--name", "cjempty", "--nodes", 1, "--command-json",
                              command], capsys)  # fmt: skip
    assert code == 0, err
    assert run_cli(["wait", "cjempty"], capsys)[0] == 0
    assert json.loads((tmp_path / "argv.json").read_text()) == ["--prefix", ""]


# ============================================================ 5. terminal escapes
@pytest.mark.security
def test_5a_prep_prints_class_names_escaped(tmp_path, capsys):
    x = np.random.default_rng(0).random((60, 4), dtype=np.float32)
    np.savez(tmp_path / "esc.npz", x=x, y=np.arange(60) % 3,
             classes=np.array(["a\x1b[2J", "b\u009b31m", "c\x07\x7f"]))  # fmt: skip
    code, out, err = run_cli(["prep", "--source", tmp_path / "esc.npz", "--output",
                              tmp_path / "data"], capsys)  # fmt: skip
    assert code == 0, err
    no_raw_escapes(out + err)
    assert "a\\x1b[2J" in out and "b\\x9b31m" in out, out


@pytest.mark.security
def test_5b_a_checkpoint_name_with_an_osc_sequence_is_escaped(tmp_path, capsys):
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "m\x1b]0;pwned\x07.pt").write_bytes(b"garbage")
    aged(*(tmp_path / "ck").iterdir())
    code, out, err = run_cli(["collect", "--checkpoint-dir", tmp_path / "ck", "--output",
                              tmp_path / "out"], capsys)  # fmt: skip
    assert code != 0
    no_raw_escapes(out + err)
    one_line(err, "kubetrain collect", "\\x1b]0;pwned\\x07")


@pytest.mark.security
def test_5c_a_collect_folder_named_with_a_c1_csi_is_printed_escaped(tmp_path, capsys):
    save_pt(tmp_path / "ck\u009b2J" / "model.pt")
    code, out, err = run_cli(["collect", "--checkpoint-dir", tmp_path / "ck\u009b2J", "--output",
                              tmp_path / "out\x1b[31m"], capsys)  # fmt: skip
    assert code == 0, err
    no_raw_escapes(out + err)
    assert "ck\\x9b2J" in out + err


@pytest.mark.security
@pytest.mark.bad_input
def test_5d_argparse_usage_errors_escape_the_value(capsys):
    # --max-restarts: an option argparse types (--nodes is read by kubetrain since issue 30,
    # whose refusal escapes too: test_hostile_issue30.py)
    code, out, err = run_cli(["launch", "--max-restarts", "\x1b[2J\u009b", "--", "true"], capsys)
    assert code == 2
    no_raw_escapes(out + err)
    one_line(err, "kubetrain launch", "--max-restarts")


@pytest.mark.security
def test_5e_metric_names_from_a_users_program_are_escaped(model, tmp_path, capsys):
    (tmp_path / "metrics.json").write_text(json.dumps({"loss": 0.1, "z\u009bq\x1b[2J": 1}))
    (tmp_path / "eval.py").write_text(METRICS_PROGRAM)
    code, out, err = evaluate_own(capsys, model, [sys.executable, tmp_path / "eval.py",
                                                  tmp_path / "metrics.json"])  # fmt: skip
    assert code == 0, err
    no_raw_escapes(out + err)


@pytest.mark.security
@pytest.mark.parametrize("status", [400, 500])
def test_5f_an_argo_servers_error_message_is_escaped(stub, capsys, status):
    body = json.dumps({"code": 3, "message": "bad \x1b[2J\x1b]0;pwned\x07 \u009b31m"}).encode()
    server = stub(status=status, body=body)
    code, out, err = run_cli(["submit", "argo", "--host", server.url], capsys)
    assert code != 0
    no_raw_escapes(out + err)
    one_line(err, "kubetrain submit", "\\x1b[2J")


@pytest.mark.security
def test_5g_a_kubernetes_apis_refusal_is_escaped(stub, tmp_path, capsys, monkeypatch):
    body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 403,
                       "reason": "Forbidden",
                       "message": "no \x1b[2J\u009b31m \x1b]0;x\x07"}).encode()  # fmt: skip
    server = stub(status=403, body=body)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig_for(server.url, tmp_path / "config")))
    code, out, err = run_cli(["list", "--backend", "trainer"], capsys)
    assert code != 0
    no_raw_escapes(out + err)
    assert "\\x1b[2J" in err, err


@pytest.mark.security
def test_5h_the_failing_ranks_lines_before_wait_s_error_are_escaped(jobs, capsys):
    program = ("import sys; sys.stderr.write('boom \\x1b]0;pwn\\x07 \\u009b2J\\n'); "
               "raise RuntimeError('bad \\x1b[31m red')")  # fmt: skip
    code, out, err = run_cli(["launch", "--name", "noisy", "--nodes", 1, "--", sys.executable,
                              "-c", program], capsys)  # fmt: skip
    assert code == 0, err
    code, out, err = run_cli(["wait", "--quiet", "noisy"], capsys)
    assert code != 0
    no_raw_escapes(out + err)
    assert "bad \\x1b[31m red" in out + err


# ========================================================================== 6. races
def test_6a_three_launches_at_once_on_one_checkpoint_folder_start_one_job(jobs, tmp_path, mark):
    code = main(["launch", "--name", "old", "--nodes", "1", "--", sys.executable, "-c", "0"])
    assert code == 0 and main(["wait", "--quiet", "old"]) == 0
    kept = [jobs / f"old{i}" for i in range(400)]  # finished jobs a user keeps (--keep-job)
    try:
        for folder in kept:
            shutil.copytree(jobs / "old", folder)
            for record in ("job.json", "status.json"):
                data = json.loads((folder / record).read_text())
                data["name"] = folder.name
                data.get("spec", {})["name"] = folder.name
                (folder / record).write_text(json.dumps(data))
        broken = []
        for round_ in range(2):
            (tmp_path / f"ck{round_}").mkdir()
            procs = [kubetrain_popen("launch", "--name", f"race{round_}-{i}", "--nodes", 1,
                                     "--checkpoint-dir", tmp_path / f"ck{round_}", "--",
                                     sys.executable, "-c", "import time; time.sleep(30)")
                     for i in range(3)]  # fmt: skip
            results = [(p.wait(60), *p.communicate()) for p in procs]
            started = [i for i, (code, _, _) in enumerate(results) if code == 0]
            if len(started) != 1:
                broken.append(results)
                break
            for code, _out, err in results:
                if code != 0:
                    one_line(err, "kubetrain launch", "checkpoint_dir", f"race{round_}-")
        assert broken == [], "more than one job started on one checkpoint folder"
    finally:
        for folder in kept:
            shutil.rmtree(folder, ignore_errors=True)


def test_6b_four_launches_with_one_name_make_one_job(jobs, tmp_path, mark):
    procs = [kubetrain_popen("launch", "--name", "same", "--nodes", 1, "--", sys.executable,
                             "-c", f"print({i}); import time; time.sleep(30)")
             for i in range(4)]  # fmt: skip
    results = [(p.wait(60), *p.communicate()) for p in procs]
    assert [code for code, _, _ in results].count(0) == 1, results
    for code, _out, err in results:
        if code != 0:
            one_line(err, "kubetrain launch", "same")
    assert [p.name for p in jobs.iterdir()] == ["same"]


@pytest.mark.bad_input
@pytest.mark.parametrize("where", ["same", "inside", "holding"])
def test_6c_a_folder_of_a_live_jobs_checkpoints_is_refused_naming_the_job(
    jobs, tmp_path, capsys, where
):
    ck = tmp_path / "shared" / "ck"
    ck.mkdir(parents=True)
    code, out, err = run_cli(["launch", "--name", "holder", "--nodes", 1, "--checkpoint-dir", ck,
                              "--", sys.executable, "-c", "import time; time.sleep(30)"],
                             capsys)  # fmt: skip
    assert code == 0, err
    target = {"same": ck, "inside": ck / "sub", "holding": tmp_path / "shared"}[where]
    code, out, err = run_cli(["launch", "--name", "intruder", "--nodes", 1, "--checkpoint-dir",
                              target, "--", sys.executable, "-c", "pass"], capsys)  # fmt: skip
    assert code == 2
    one_line(err, "kubetrain launch", "checkpoint_dir", "holder")
    assert not (jobs / "intruder").exists()


def test_6d_two_deletes_at_once_both_succeed_with_ignore_not_found(jobs, capsys, mark):
    failures = []
    for n in range(2):
        name = f"twice{n}"
        code, out, err = run_cli(["launch", "--name", name, "--nodes", 2, "--", sys.executable,
                                  "-c", "import time; time.sleep(30)"], capsys)  # fmt: skip
        assert code == 0, err
        procs = [kubetrain_popen("delete", "--ignore-not-found", name) for _ in range(2)]
        for proc in procs:
            code = proc.wait(30)
            out, err = proc.communicate()
            if code != 0:
                failures.append(err.strip())
    assert failures == []
    assert left_running(mark) == []


def test_6f_a_delete_while_wait_follows_ends_the_wait_in_one_line(jobs, capsys, mark):
    code, out, err = run_cli(["launch", "--name", "followed", "--nodes", 2, "--",
                              sys.executable, "-c", "import time; time.sleep(30)"],
                             capsys)  # fmt: skip
    assert code == 0, err
    waiter = kubetrain_popen("wait", "followed")
    time.sleep(1.0)
    code, out, err = run_cli(["delete", "followed"], capsys)
    assert code == 0, err
    wait_code = waiter.wait(20)
    out, err = waiter.communicate()
    assert wait_code != 0
    one_line(err, "kubetrain wait", "followed")
    assert left_running(mark) == []
